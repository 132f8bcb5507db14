"""``Admin/Rebalance`` as the servicer answers it: FAILED_PRECONDITION where there is no hook (not a decode
node) or while draining, INVALID_ARGUMENT naming the field past its bound, and the hook called with the
defaults filled in otherwise. A refused call never reaches the hook."""

from __future__ import annotations

import pytest
from pdserve.v1 import admin_pb2

from services.common.admin import MAX_REBALANCE_MS, MAX_REBALANCE_REQUESTS, AdminServicer
from services.common.config import build_config
from services.common.errors import FailedPreconditionError, InvalidArgumentError
from services.gateway.config import GatewayConfig


class _Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def _servicer(stopping: bool = False, hook: bool = True):
    calls = []

    async def rebalance(max_requests: int, within_s: float, reason: str):
        calls.append((max_requests, within_s, reason))
        return ["moved-1"], ["kept-1"]

    return AdminServicer(lambda: None, lambda: stopping, lambda: rebalance if hook else None), calls


async def _call(servicer, **fields):
    return await servicer.Rebalance.__wrapped__(servicer, admin_pb2.RebalanceRequest(**fields), _Context())


async def test_defaults_reach_the_hook_and_its_ids_come_back():
    servicer, calls = _servicer()
    reply = await _call(servicer)
    assert (list(reply.moved), list(reply.kept)) == (["moved-1"], ["kept-1"])
    await _call(servicer, max_requests=3, within_ms=2500, reason="hot")
    assert calls == [(1, 10.0, ""), (3, 2.5, "hot")]


@pytest.mark.parametrize(("fields", "error", "field"), [
    ({"max_requests": MAX_REBALANCE_REQUESTS + 1}, InvalidArgumentError, "max_requests"),
    ({"within_ms": MAX_REBALANCE_MS + 1}, InvalidArgumentError, "within_ms"),
])
async def test_a_field_past_its_bound_is_refused_naming_it(fields, error, field):
    servicer, calls = _servicer()
    with pytest.raises(error, match=f"^{field}: "):
        await _call(servicer, **fields)
    assert calls == []


@pytest.mark.parametrize(("stopping", "hook", "says"), [(False, False, "only a decode node"), (True, True, "draining")])
async def test_no_hook_or_a_draining_node_is_a_failed_precondition(stopping, hook, says):
    servicer, calls = _servicer(stopping=stopping, hook=hook)
    with pytest.raises(FailedPreconditionError, match=says):
        await _call(servicer, max_requests=1)
    assert calls == []


def test_a_negative_resume_count_is_refused():
    required = ["--prefill", "127.0.0.1:1", "--decode", "127.0.0.1:2"]
    assert build_config(GatewayConfig, required, env={}).resumes_after_first_token == 2
    with pytest.raises((ValueError, SystemExit)):
        build_config(GatewayConfig, [*required, "--resumes-after-first-token", "-1"], env={})

"""An Abort on the prefill node answers only once the request is gone there and on its decode node, so a
client may reuse the id at once; a request whose id is still running is refused. A prefill node and a
decode node in one process, real gRPC, a tiny random model on the CPU."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.engine.errors import DuplicateRequestError
from services.engine.random_llama import PRESETS, random_model
from services.prefill_node.node import PrefillNode, Reserved
from tests.prefill_node.test_kv_ipc_transfer import GREEDY, PROMPT, engine, generate
from tests.prefill_node.test_lease_keepalive import idle, pair

LEASE_S = 30.0  # nothing here is freed by a lease


@pytest.fixture(scope="module")
def model():
    return random_model(PRESETS["tiny"], torch.float32)


@pytest.fixture(scope="module")
def expected(model) -> list[int]:
    return engine(model).generate([PROMPT], GREEDY)[0].token_ids


async def started(prefill: PrefillNode, address: str, request_id: str) -> asyncio.Task:
    """A Prefill call in its own task (as the gRPC server runs it), once its reservation is granted."""
    reserved = asyncio.Event()

    async def call() -> None:
        async for event in prefill.prefill(request_id, PROMPT, GREEDY, [address], timeout_s=30):
            if isinstance(event, Reserved):
                reserved.set()
                await asyncio.Event().wait()  # the caller reads no further: it is about to give up

    task = asyncio.ensure_future(call())
    await reserved.wait()
    return task


def holds(decode, request_id: str) -> bool:
    engine = decode.engine
    return request_id in engine.reservations.reservations or engine.kv.has_request(request_id)


@pytest.mark.parametrize("cancelled_first", [True, False], ids=["call cancelled, then Abort", "Abort alone"])
async def test_an_abort_answers_once_the_request_is_gone_and_the_id_is_free_again(model, expected,
                                                                                  cancelled_first):
    async with pair(model, lease_s=LEASE_S) as (prefill, decode, address):
        call = await started(prefill, address, "reused")
        assert holds(decode, "reused")
        if cancelled_first:  # what the gateway does: cancel its call, then send Abort
            call.cancel()
        assert await prefill.abort("reused")
        assert not holds(decode, "reused") and not prefill.engine.kv.has_request("reused")
        assert call.done() and call.cancelled()
        tokens, _ = await generate(prefill, decode, address, "reused")
        assert tokens == expected
        await idle(decode)


async def test_a_request_id_still_running_here_is_refused(model):
    async with pair(model, lease_s=LEASE_S) as (prefill, decode, address):
        call = await started(prefill, address, "twice")
        with pytest.raises(DuplicateRequestError, match="'twice' is already running"):
            await anext(prefill.prefill("twice", PROMPT, GREEDY, [address], timeout_s=30))
        assert holds(decode, "twice")  # the first one is untouched
        await prefill.abort("twice")
        assert call.cancelled()
        await idle(decode)

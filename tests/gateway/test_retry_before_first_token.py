"""A node that fails before the first token (UNAVAILABLE, or a prefill stream that ends) makes the request
start over on other nodes: the client gets its whole answer under its own request id, the failed attempt
is aborted on the nodes that held it, and the new attempt runs under an id of its own. Failures that say
something about the request, failures after the first token, and a gateway with retries off reach the
client as they are. In-process gateway over fake nodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from pdserve.v1 import decode_pb2, prefill_pb2

from services.gateway.redaction import redact_addresses
from tests.gateway.conftest import Cluster, start_cluster, stop_cluster
from tests.gateway.fakes import eventually
from tests.gateway.test_generate import TEXT, collect, failure, request

PROMPT = "Tell me about foxes"


@pytest.fixture
async def two_prefill(tokenizer, model_config) -> AsyncIterator[Cluster]:
    running = await start_cluster(tokenizer, model_config, num_prefill=2)
    try:
        yield running
    finally:
        await stop_cluster(running)


def fail_first_call(cluster: Cluster, tokenizer, how: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
                    ) -> list[str]:
    """Whichever prefill node gets the first Prefill call fails it after reserving on the decode node;
    every later call is answered well. The decode node answers the rest of ``TEXT``. Returns the ids the
    prefill nodes were asked for, in order."""
    ids = tokenizer.encode(TEXT)
    cluster.d.tokens = tuple(ids[1:])
    calls: list[str] = []

    async def prefill(request, context):
        calls.append(request.request_id)
        yield prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(decode_address=request.decode_candidates[0]))
        if len(calls) == 1:
            if how == "stream ends":
                return
            if how == "after the first token":
                yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=ids[0]))
                await asyncio.sleep(0.2)
            await context.abort(code, "the node went away")
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=ids[0]))
        yield prefill_pb2.PrefillEvent(done=prefill_pb2.Done(num_computed_tokens=len(request.prompt_token_ids)))

    for node in cluster.prefill:
        node.script = prefill
    return calls


def retries_counted(cluster: Cluster, role: str = "prefill") -> float:
    registry = cluster.gateway.servicer.metrics.registry
    return registry.get_sample_value("pdserve_gateway_retries_total", {"role": role}) or 0


@pytest.mark.parametrize("how", ["error", "stream ends"])
async def test_a_prefill_node_failing_before_the_first_token_is_replaced_by_another(two_prefill, tokenizer, how):
    cluster = two_prefill
    calls = fail_first_call(cluster, tokenizer, how)
    responses = await collect(cluster, request(PROMPT, max_tokens=32), timeout=10)

    assert "".join(r.text for r in responses) == TEXT and responses[-1].finish_reason == "length"
    request_id = responses[0].request_id
    assert {r.request_id for r in responses} == {request_id}  # the client sees its own id throughout
    first, second = calls
    assert first == request_id and second.startswith(f"{request_id}~retry1-")
    failed = next(p for p in cluster.prefill if p.requests[0].request_id == first)
    replacement = next(p for p in cluster.prefill if p is not failed)
    assert responses[0].prefill_node == replacement.address
    assert cluster.d.attaches[-1] == second  # the decode node relayed the new attempt
    await cluster.gateway.core.wait_background()
    assert first in cluster.d.aborts  # the failed attempt's reservation is let go
    assert second not in cluster.d.aborts + failed.aborts + replacement.aborts
    assert retries_counted(cluster) == 1
    assert cluster.gateway.core.in_flight == 0


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INTERNAL])
async def test_a_failure_that_says_something_about_the_request_is_not_retried(two_prefill, tokenizer, code):
    cluster = two_prefill
    calls = fail_first_call(cluster, tokenizer, "error", code)
    error = await failure(cluster, request(PROMPT, max_tokens=32))
    assert error.code() == code and "the node went away" in error.details()
    assert len(calls) == 1 and retries_counted(cluster) == 0


async def test_a_failure_after_the_first_token_is_not_retried(two_prefill, tokenizer):
    cluster = two_prefill
    calls = fail_first_call(cluster, tokenizer, "after the first token")
    cluster.d.hold.clear()

    async def attach(request, context):  # the decode node has not sent a token yet when the prefill node fails
        await cluster.d.hold.wait()
        yield  # pragma: no cover

    cluster.d.script = attach
    error = await failure(cluster, request(PROMPT, max_tokens=32))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and len(calls) == 1


async def test_with_retries_off_the_failure_is_the_client_s_answer(tokenizer, model_config):
    cluster = await start_cluster(tokenizer, model_config, num_prefill=2, retries_before_first_token=0)
    try:
        calls = fail_first_call(cluster, tokenizer, "error")
        error = await failure(cluster, request(PROMPT, max_tokens=32))
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "the node went away" in error.details()
        assert len(calls) == 1
    finally:
        await stop_cluster(cluster)


async def test_the_only_prefill_node_is_tried_again_while_it_looks_healthy(cluster, tokenizer):
    """It may have failed the call for a decode node's sake (the KV transfer broke): it answers the status
    poll the gateway sends before trying it again (a hung one does not: tests/e2e/test_faults.py)."""
    calls = fail_first_call(cluster, tokenizer, "error")
    responses = await collect(cluster, request(PROMPT, max_tokens=32), timeout=10)
    assert "".join(r.text for r in responses) == TEXT and len(calls) == 2
    assert calls[1].startswith(f"{calls[0]}~retry1-")


async def test_one_retry_only_by_default(two_prefill, tokenizer):
    """Both prefill nodes fail: the client hears the second failure (not a loop between them)."""
    cluster = two_prefill
    calls: list[str] = []

    async def prefill(request, context):
        calls.append(request.request_id)
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"node failure {len(calls)}")
        yield  # pragma: no cover

    for node in cluster.prefill:
        node.script = prefill
    error = await failure(cluster, request(PROMPT, max_tokens=32))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "node failure 2" in error.details()
    assert len(calls) == 2 and retries_counted(cluster) == 1


async def test_a_decode_node_failing_before_the_first_token_is_replaced_by_another(tokenizer, model_config):
    """The decode node the first attempt reserved on fails its Attach before the first token: the request
    starts over with that node left out of the candidates."""
    cluster = await start_cluster(tokenizer, model_config, num_decode=2)
    try:
        ids = tokenizer.encode(TEXT)
        for node in cluster.decode:
            node.tokens = tuple(ids[1:])
        first_token_sent = asyncio.Event()
        calls: list[tuple[str, str]] = []

        async def prefill(request, context):
            decode = request.decode_candidates[0]
            calls.append((request.request_id, decode))
            yield prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(decode_address=decode))
            if len(calls) == 1:
                await first_token_sent.wait()  # the first attempt never gets that far
            yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=ids[0]))
            yield prefill_pb2.PrefillEvent(done=prefill_pb2.Done(num_computed_tokens=len(request.prompt_token_ids)))

        async def failing_attach(request, context):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the decode node went away")
            yield  # pragma: no cover

        cluster.p.script = prefill
        by_address = {node.address: node for node in cluster.decode}

        async def fail_only_the_first(request, context):
            events = failing_attach if len(calls) == 1 else by_address[calls[-1][1]].well_behaved
            async for event in events(request, context):
                yield event

        for node in cluster.decode:
            node.script = fail_only_the_first
        responses = await collect(cluster, request(PROMPT, max_tokens=32), timeout=10)

        assert "".join(r.text for r in responses) == TEXT
        (first_id, failed), (second_id, replacement) = calls
        assert replacement != failed and second_id.startswith(f"{first_id}~retry1-")
        assert responses[0].decode_node == replacement
        assert retries_counted(cluster, "decode") == 1 and retries_counted(cluster, "prefill") == 0
        await cluster.gateway.core.wait_background()
        assert first_id in cluster.p.aborts  # the first attempt let go on the prefill node
    finally:
        await stop_cluster(cluster)


async def test_a_failed_request_is_logged_with_its_code(two_prefill, tokenizer):
    """Every request that fails leaves one line naming its id, code and message (a RESOURCE_EXHAUSTED or
    DEADLINE_EXCEEDED request left none)."""
    import structlog.testing

    cluster = two_prefill
    fail_first_call(cluster, tokenizer, "error", grpc.StatusCode.RESOURCE_EXHAUSTED)
    with structlog.testing.capture_logs() as logs:
        error = await failure(cluster, request(PROMPT, max_tokens=32))
    failed = [line for line in logs if line["event"] == "request failed"]
    assert len(failed) == 1 and failed[0]["code"] == "RESOURCE_EXHAUSTED" and failed[0]["request_id"]
    assert redact_addresses(failed[0]["error"]) == error.details()  # the log keeps the addresses


async def test_the_retry_does_not_wait_for_the_failed_node_to_answer_its_abort(tokenizer, model_config):
    """A hung node may never answer: its Abort goes in the background (the id stays taken until it ends);
    the decode node's is answered before the new attempt starts."""
    cluster = await start_cluster(tokenizer, model_config, num_prefill=2, abort_timeout_s=8.0)
    try:
        calls = fail_first_call(cluster, tokenizer, "error")
        for node in cluster.prefill:
            node.abort_delay_s = 20.0  # past the gateway's abort timeout: no answer
        responses = await collect(cluster, request(PROMPT, max_tokens=32), timeout=6)  # well before 8 s
        assert "".join(r.text for r in responses) == TEXT
        failed = next(p for p in cluster.prefill if p.requests[0].request_id == calls[0])
        assert failed.aborts == [calls[0]] and failed.aborts_answered == []
        assert calls[0] in cluster.d.aborts_answered  # the decode node's was answered before the retry
        assert responses[0].request_id in cluster.gateway.core._taken  # until the failed node's abort ends
        await cluster.gateway.core.wait_background()
        assert responses[0].request_id not in cluster.gateway.core._taken
    finally:
        await stop_cluster(cluster)


async def test_an_id_whose_abort_got_no_answer_runs_fresh_when_reused(two_prefill, tokenizer):
    """The node that did not answer may wake up and abort whatever runs under the id on a decode node."""
    cluster = two_prefill
    calls = fail_first_call(cluster, tokenizer, "error")
    for node in cluster.prefill:
        node.abort_delay_s = 3.0
    await collect(cluster, gateway_request(PROMPT, "reused"), timeout=10)
    await cluster.gateway.core.wait_background()  # the Abort to the failed node timed out
    await collect(cluster, gateway_request(PROMPT, "reused"), timeout=10)
    assert calls[0] == "reused" and calls[1].startswith("reused~retry1-")
    assert calls[2].startswith("reused~") and "retry" not in calls[2]  # out of the old attempt's reach

    for node in cluster.prefill:
        node.abort_delay_s = 0.0
    ids = tokenizer.encode(TEXT)

    async def stalls(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        await asyncio.Event().wait()

    cluster.d.script = stalls
    call = cluster.stub.Generate(gateway_request(PROMPT, "answered"), timeout=10)
    await call.read()
    call.cancel()  # aborted on its nodes, which answer
    await eventually(lambda: cluster.gateway.core.in_flight == 0, what="the cancel to reach the gateway")
    await cluster.gateway.core.wait_background()
    cluster.d.script = cluster.d.well_behaved
    await collect(cluster, gateway_request(PROMPT, "answered"), timeout=10)
    assert calls[-2:] == ["answered", "answered"]  # an id whose aborts were answered is reused as it is


async def test_a_request_ended_by_its_deadline_is_logged(cluster, tokenizer):
    import structlog.testing

    from tests.gateway.test_generate import stall_after

    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]
    stall_after(cluster, ids)

    def ended() -> list[dict]:
        return [line for line in logs if line["event"] in ("request cancelled", "request failed")]

    with structlog.testing.capture_logs() as logs:
        error = await failure(cluster, request(PROMPT, max_tokens=32), timeout=0.5)
        await cluster.gateway.core.wait_background()
        # the client hears DEADLINE_EXCEEDED first; the server notices the deadline a moment later (under load,
        # after wait_background returned): wait for the line inside the capture, then check there is one
        await eventually(lambda: bool(ended()), what="the request's end logged")
        await asyncio.sleep(0.1)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    lines = ended()
    assert len(lines) == 1 and lines[0]["request_id"]  # the gateway's handler cancelled, or a node call's
    assert lines[0]["event"] == "request cancelled" or lines[0]["code"] == "DEADLINE_EXCEEDED"  # deadline first


def gateway_request(prompt: str, request_id: str):
    from pdserve.v1 import gateway_pb2

    return gateway_pb2.GenerateRequest(prompt=prompt, request_id=request_id,
                                       sampling=gateway_pb2.SamplingParams(max_tokens=32))

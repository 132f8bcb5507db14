"""Generate through the in-process gateway over fake prefill and decode nodes: relaying, stop strings,
errors, cancellation, bad input."""

from __future__ import annotations

import asyncio
import time

import grpc
import grpc.aio
import pytest
from pdserve.v1 import decode_pb2, gateway_pb2, prefill_pb2

from tests.gateway.conftest import MAX_MODEL_LEN, Cluster, start_cluster, stop_cluster
from tests.gateway.fakes import eventually

TEXT = " The quick brown fox jumps over the lazy dog."


def request(prompt: str = "Hello there", **sampling) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(prompt=prompt, sampling=gateway_pb2.SamplingParams(**sampling))


async def collect(cluster: Cluster, message: gateway_pb2.GenerateRequest, timeout: float = 5.0
                  ) -> list[gateway_pb2.GenerateResponse]:
    return [r async for r in cluster.stub.Generate(message, timeout=timeout)]


async def failure(cluster: Cluster, message: gateway_pb2.GenerateRequest, timeout: float = 5.0
                  ) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(collect(cluster, message, timeout), timeout + 2)
    return error.value


def script_tokens(cluster: Cluster, tokenizer, text: str = TEXT, cached_tokens: int = 0) -> list[int]:
    """P answers the first token of ``text``; D the rest in two events, the last with ``length``."""
    ids = tokenizer.encode(text)
    cluster.p.first_token, cluster.p.cached_tokens = ids[0], cached_tokens

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:4])
        yield decode_pb2.TokenEvent(token_ids=ids[4:], finish_reason="length",
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)))

    cluster.d.script = attach
    return ids


def stall_after(cluster: Cluster, ids: list[int]) -> None:
    """D sends ``ids[1:3]`` then hangs until the gateway gives up on it."""

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        await asyncio.Event().wait()

    cluster.d.script = attach


async def test_tokens_from_prefill_then_decode_with_text_and_usage(cluster, tokenizer):
    ids = script_tokens(cluster, tokenizer, cached_tokens=16)
    started = time.time()
    responses = await collect(cluster, request(temperature=0.0, max_tokens=len(ids)))

    assert [list(r.token_ids) for r in responses] == [ids[:1], ids[1:4], ids[4:]]
    assert "".join(r.text for r in responses) == tokenizer.decode(ids)
    first, last = responses[0], responses[-1]
    assert (first.prefill_node, first.decode_node) == (cluster.p.address, cluster.d.address)
    assert len({r.request_id for r in responses}) == 1 and len(first.request_id) == 32  # a uuid4 hex
    assert [r.finish_reason for r in responses] == ["", "", "length"]
    assert [r.HasField("usage") for r in responses] == [False, False, True]
    prompt_ids = tokenizer.encode("Hello there")
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.cached_tokens) == (
        len(prompt_ids), len(ids), 16)

    sent = cluster.p.requests[0]
    assert list(sent.prompt_token_ids) == prompt_ids and list(sent.decode_candidates) == [cluster.d.address]
    assert sent.request_id == first.request_id and cluster.d.attaches == [first.request_id]
    assert sent.sampling.HasField("seed") and sent.sampling.temperature == 0.0
    assert sent.sampling.max_tokens == len(ids) and sent.sampling.top_p == 1.0
    assert started * 1000 + 4000 < sent.deadline_unix_ms <= time.time() * 1000 + 5100  # grpc rounds timeouts
    await cluster.gateway.core.wait_background()
    assert cluster.p.aborts == [] and cluster.d.aborts == [] and cluster.d.cancelled == []
    assert cluster.gateway.directory.nodes()[0].inflight == 0


async def test_defaults_are_resolved_before_prefill(cluster, tokenizer):
    script_tokens(cluster, tokenizer)
    await collect(cluster, gateway_pb2.GenerateRequest(request_id="mine", token_ids=[1, 2, 3]), timeout=30)
    await collect(cluster, gateway_pb2.GenerateRequest(token_ids=[1] * (MAX_MODEL_LEN - 100)))
    [_ async for _ in cluster.stub.Generate(gateway_pb2.GenerateRequest(token_ids=[1]))]  # no deadline
    first, long, unbounded = cluster.p.requests
    assert first.request_id == "mine"
    assert first.deadline_unix_ms > 0 and unbounded.deadline_unix_ms == 0
    assert (first.sampling.max_tokens, first.sampling.temperature, first.sampling.top_k) == (256, 1.0, 0)
    assert long.sampling.max_tokens == 100  # what the context has room for
    assert first.sampling.seed != long.sampling.seed  # drawn per request


async def test_truncate_prompt_tokens_keeps_the_last_tokens_and_a_bad_value_is_refused(cluster, tokenizer):
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]
    message = request("one two three four five", max_tokens=1)
    message.truncate_prompt_tokens = 2
    responses = await collect(cluster, message)
    assert list(cluster.p.requests[-1].prompt_token_ids) == tokenizer.encode("one two three four five")[-2:]
    assert responses[-1].usage.prompt_tokens == 2
    message.truncate_prompt_tokens = 0
    error = await failure(cluster, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "truncate_prompt_tokens" in error.details()
    assert len(cluster.p.requests) == 1


async def test_a_stop_string_ends_the_request_and_aborts_the_decode_node(cluster, tokenizer):
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:])  # past the stop string
        await asyncio.Event().wait()  # the gateway must end the call

    cluster.d.script = attach
    responses = await collect(cluster, request(stop=[" brown"]))

    assert "".join(r.text for r in responses) == " The quick"
    last = responses[-1]
    assert last.finish_reason == "stop"
    kept = [t for r in responses for t in r.token_ids]
    assert tokenizer.decode(kept).endswith(" brown") and kept == ids[:len(kept)]
    assert last.usage.completion_tokens == len(kept) < len(ids)
    assert cluster.d.aborts == [last.request_id]  # before the client heard of the end
    assert cluster.p.requests[0].sampling.stop == []  # stop strings are the gateway's business
    await eventually(lambda: cluster.d.cancelled == [last.request_id], what="Attach cancelled")


async def test_a_stop_string_completed_by_tokens_held_back_for_a_split_character_is_a_stop(cluster, tokenizer):
    """The last tokens end inside an emoji, so they are held back until the end; the space they carry
    completes the stop string ("é "), and the finish is a stop, as the mixed engine reports it."""
    ids = tokenizer.encode(" café 😀")[:-1]
    cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:], finish_reason="length")

    cluster.d.script = attach
    responses = await collect(cluster, request(stop=["é "], max_tokens=len(ids)))
    assert "".join(r.text for r in responses) == " caf"
    assert responses[-1].finish_reason == "stop"


async def test_a_first_token_that_finishes_ends_the_request(cluster, tokenizer):
    cluster.p.first_token, cluster.p.first_finish_reason = tokenizer.encode(" Yes")[0], "length"
    responses = await collect(cluster, request(max_tokens=1))
    assert len(responses) == 1
    only = responses[0]
    assert (only.text, only.finish_reason, only.usage.completion_tokens) == (" Yes", "length", 1)
    assert only.prefill_node == cluster.p.address


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
async def test_a_prefill_error_reaches_the_client_with_its_code(cluster, code):
    async def prefill(request, context):
        yield prefill_pb2.PrefillEvent(refused=prefill_pb2.Refused(decode_address=cluster.d.address,
                                                                   reason="no free blocks"))
        await context.abort(code, "every decode candidate refused")

    cluster.p.script = prefill
    error = await failure(cluster, request())
    assert error.code() == code
    assert "every decode candidate refused" in error.details()
    assert cluster.p.address not in error.details() and "[internal]" in error.details()  # no address to clients


@pytest.mark.parametrize("how", ["killed", "stream ends", "error"])
async def test_a_failing_decode_node_is_unavailable_never_a_hang(cluster, tokenizer, how):
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]
    sent = asyncio.Event()

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        sent.set()
        if how == "error":
            await context.abort(grpc.StatusCode.INTERNAL, "decode step crashed")
        if how == "killed":
            await asyncio.Event().wait()

    cluster.d.script = attach

    async def kill_decode() -> None:
        await sent.wait()
        await cluster.d.stop()

    killer = asyncio.ensure_future(kill_decode() if how == "killed" else asyncio.sleep(0))
    error = await failure(cluster, request(), timeout=20)  # the deadline is not what ends it
    await killer
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "decode node [internal] failed" in error.details() and cluster.d.address not in error.details()
    if how == "killed":
        assert not cluster.gateway.directory.nodes("decode")[0].healthy  # avoided until a poll answers


@pytest.mark.parametrize("when", ["after tokens", "before the first token"])
async def test_a_decode_node_that_aborted_the_request_is_an_error_naming_why(cluster, tokenizer, when):
    """An "abort" end (its lease expired, its prefill node gave up) is never a successful finish."""
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]
    reason = "its reservation lease expired: the prefill node sent nothing for it for the lease's length"

    async def attach(request, context):
        if when == "after tokens":
            yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        yield decode_pb2.TokenEvent(finish_reason="abort", abort_reason=reason)

    cluster.d.script = attach
    error = await failure(cluster, request())
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert error.details() == f"decode node [internal] aborted the request: {reason}"
    await cluster.gateway.core.wait_background()
    assert cluster.d.aborts == []  # it holds nothing more: no Abort to send


async def test_a_first_token_that_finishes_is_not_spoiled_by_the_decode_node_s_abort(cluster, tokenizer):
    """The prefill node aborts the decode node's reservation when its first token ends the request; the
    decode node's "abort" end may reach the gateway before that first token does."""
    cluster.p.first_token, cluster.p.first_finish_reason = tokenizer.encode(" Yes")[0], "length"

    async def attach(request, context):
        yield decode_pb2.TokenEvent(finish_reason="abort", abort_reason="the prefill node: the first token "
                                                                       "finished the request")

    cluster.d.script = attach
    responses = await collect(cluster, request(max_tokens=1))
    assert [(r.text, r.finish_reason) for r in responses] == [(" Yes", "length")]


async def test_client_cancel_aborts_on_prefill_and_decode(cluster, tokenizer):
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]

    async def prefill(request, context):  # still busy (not done) when the client leaves
        yield prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(decode_address=cluster.d.address))
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=ids[0]))
        await asyncio.Event().wait()

    cluster.p.script = prefill
    stall_after(cluster, ids)
    call = cluster.stub.Generate(request(), timeout=10)
    received = [await call.read(), await call.read()]
    request_id = received[0].request_id
    call.cancel()

    await eventually(lambda: cluster.p.aborts == [request_id] and cluster.d.aborts == [request_id],
                     what="Abort on both nodes")
    await eventually(lambda: sorted(cluster.p.cancelled + cluster.d.cancelled) == [request_id] * 2,
                     what="both calls cancelled")
    assert cluster.gateway.core.in_flight == 0


async def test_a_passed_deadline_aborts_on_prefill_and_decode(cluster, tokenizer):
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]
    stall_after(cluster, ids)
    error = await failure(cluster, request(), timeout=0.5)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: len(cluster.d.aborts) == 1, what="Abort on the decode node")
    assert cluster.d.cancelled == cluster.d.aborts
    await cluster.gateway.core.wait_background()
    assert cluster.gateway.core.in_flight == 0


async def test_a_request_id_in_flight_cannot_be_reused(cluster, tokenizer):
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]
    stall_after(cluster, ids)
    message = request()
    message.request_id = "twice"
    call = cluster.stub.Generate(message, timeout=10)
    await call.read()
    error = await failure(cluster, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("request_id")
    call.cancel()


def chat(*roles: str) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(messages=[gateway_pb2.ChatMessage(role=r, content="hi") for r in roles])


BAD_INPUT = {
    "prompt and token_ids": (gateway_pb2.GenerateRequest(prompt="a", token_ids=[1]), "prompt"),
    "nothing": (gateway_pb2.GenerateRequest(), "prompt"),
    "max_tokens 0": (request(max_tokens=0), "max_tokens"),
    "temperature < 0": (request(temperature=-0.5), "temperature"),
    "top_p 0": (request(top_p=0.0), "top_p"),
    "top_k < -1": (request(top_k=-3), "top_k"),
    "seed past 63 bits": (request(seed=1 << 63), "seed"),  # uint64 on the wire; would collide with seed 0
    "unknown role": (chat("user", "wizard"), "messages[1].role"),
    "id outside the vocabulary": (gateway_pb2.GenerateRequest(token_ids=[5, 49152]), "token_ids"),
    "stop id outside the vocabulary": (request(stop_token_ids=[1 << 20]), "stop_token_ids"),
    "1025 stop ids": (request(stop_token_ids=[7] * 1025), "stop_token_ids"),
    "65 stop strings": (request(stop=[f"s{i}" for i in range(65)]), "stop"),
    "a 1025-character stop string": (request(stop=["x" * 1025]), "stop"),
    "prompt over the context": (gateway_pb2.GenerateRequest(token_ids=[7] * MAX_MODEL_LEN), "prompt"),
    "messages past the context": (gateway_pb2.GenerateRequest(
        messages=[gateway_pb2.ChatMessage(role="user", content="")] * MAX_MODEL_LEN), "messages"),
    "max_tokens over the context": (request(max_tokens=MAX_MODEL_LEN), "max_tokens"),
    "a 225-character request id": (gateway_pb2.GenerateRequest(request_id="r" * 225, prompt="a"), "request_id"),
    "a request id with a newline": (gateway_pb2.GenerateRequest(request_id="a\nb", prompt="a"), "request_id"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
async def test_bad_input_is_invalid_argument_naming_the_field_and_calls_no_node(cluster, case):
    message, field = BAD_INPUT[case]
    error = await failure(cluster, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field}:"), error.details()
    assert cluster.p.requests == [] and cluster.d.attaches == []
    assert cluster.p.aborts == [] and cluster.d.aborts == []


async def test_a_request_past_max_request_mib_is_refused_before_it_is_parsed(tokenizer, model_config):
    """A 64 MiB message holds 50M token ids: reading them took seconds of the gateway's event loop."""
    cluster = await start_cluster(tokenizer, model_config, max_request_mib=1)
    try:
        error = await failure(cluster, gateway_pb2.GenerateRequest(token_ids=[7] * (1 << 20)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in error.details()
        error = await failure(cluster, gateway_pb2.GenerateRequest(token_ids=[7] * 500_000))  # under: read
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("prompt: 500000 tokens")
        assert cluster.p.requests == []
    finally:
        await stop_cluster(cluster)


async def test_the_model_directory_generation_config_fills_unset_sampling_fields(tokenizer, model_config, tmp_path):
    import json

    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    for mode, expected in (("auto", (0.6, 0.95, 20)), ("none", (1.0, 1.0, 0))):
        running = await start_cluster(tokenizer, model_config, model_path=tmp_path, generation_config=mode)
        try:
            script_tokens(running, tokenizer)
            await collect(running, gateway_pb2.GenerateRequest(token_ids=[1, 2, 3]), timeout=30)
            await collect(running, gateway_pb2.GenerateRequest(
                token_ids=[1, 2, 3], sampling=gateway_pb2.SamplingParams(temperature=0.0, top_k=5)), timeout=30)
            unset, given = (r.sampling for r in running.p.requests)
            assert (unset.temperature, unset.top_p, unset.top_k) == pytest.approx(expected)
            assert (given.temperature, given.top_p, given.top_k) == pytest.approx((0.0, expected[1], 5))
        finally:
            await stop_cluster(running)

"""The gateway's ``Embed`` over fake prefill nodes (``services/gateway/embedding.py``): the input reaches one prefill
node as token ids under an id of the gateway's own, its state comes back pooled as asked; a node failing or
draining (``UNAVAILABLE``) is left for the next one, any other error keeps its code; bad input is refused before
any node is called; a client's cancel reaches the node; a drain lets an embedding finish."""

from __future__ import annotations

import asyncio
import math

import grpc
import grpc.aio
import pytest
from pdserve.v1 import gateway_pb2

from services.gateway.embedding import pooled
from tests.gateway.conftest import start_cluster, stop_cluster


def test_pooled_cuts_then_normalises_to_float32():
    assert pooled([3.0, 4.0, 12.0], normalize=False, dimensions=0) == [3.0, 4.0, 12.0]
    assert pooled([3.0, 4.0, 12.0], normalize=True, dimensions=2) == pytest.approx([0.6, 0.8], abs=1e-7)
    assert pooled([0.0, 0.0], normalize=True, dimensions=0) == [0.0, 0.0], "a zero state stays zero"
    one = pooled([0.1] * 7, normalize=True, dimensions=0)
    assert math.isclose(math.fsum(v * v for v in one), 1.0, rel_tol=1e-6)
    assert all(v == float(__import__("numpy").float32(v)) for v in one), "float32 values, as base64 sends them"


async def test_an_input_is_embedded_on_a_prefill_node_and_pooled_as_asked(cluster, tokenizer):
    ids = tokenizer.encode("Hello there, general")
    reply = await cluster.stub.Embed(gateway_pb2.EmbedRequest(prompt="Hello there, general", request_id="mine",
                                                              normalize=False), timeout=10)
    (sent,) = cluster.p.embed_requests
    assert list(sent.prompt_token_ids) == ids and sent.request_id.startswith("embed-"), "an id of its own"
    assert reply.request_id == "mine" and reply.prefill_node == cluster.p.address
    assert list(reply.embedding) == [float(i) for i in range(len(ids))]
    assert (reply.usage.prompt_tokens, reply.usage.cached_tokens) == (len(ids), 0)
    normalised = await cluster.stub.Embed(gateway_pb2.EmbedRequest(token_ids=[5, 6, 7], dimensions=2), timeout=10)
    assert list(normalised.embedding) == [0.0, 1.0]
    with pytest.raises(grpc.aio.AioRpcError):
        await cluster.stub.Embed(gateway_pb2.EmbedRequest(), timeout=10)
    registry = cluster.gateway.servicer.metrics.registry
    counts = {outcome: registry.get_sample_value("pdserve_embeddings_total", {"outcome": outcome})
              for outcome in ("ok", "invalid_argument")}
    assert counts == {"ok": 2.0, "invalid_argument": 1.0}
    assert registry.get_sample_value("pdserve_embedding_prompt_tokens_total") == len(ids) + 3


async def test_a_text_gets_the_special_tokens_its_tokenizer_adds_unless_told_not_to(cluster, tokenizer, monkeypatch):
    plain = tokenizer.encode_plain("Hello there")
    monkeypatch.setattr(tokenizer, "encode", lambda text: [1, *tokenizer.encode_plain(text)])  # a BOS-adding one
    await cluster.stub.Embed(gateway_pb2.EmbedRequest(prompt="Hello there"), timeout=10)
    await cluster.stub.Embed(gateway_pb2.EmbedRequest(prompt="Hello there", add_special_tokens=False), timeout=10)
    assert [list(r.prompt_token_ids) for r in cluster.p.embed_requests] == [[1, *plain], plain]


@pytest.mark.parametrize(("request_fields", "named"), [
    ({}, "prompt"),
    ({"prompt": "a", "token_ids": [1]}, "prompt"),
    ({"token_ids": [10**7]}, "token_ids"),
    ({"prompt": "Hello", "dimensions": 10**6}, "dimensions"),
    ({"prompt": "Hello", "request_id": "bad id\n"}, "request_id"),
])
async def test_bad_input_is_refused_before_any_node_is_called(cluster, request_fields, named):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cluster.stub.Embed(gateway_pb2.EmbedRequest(**request_fields), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in refused.value.details()
    assert cluster.p.embed_requests == []


async def test_an_unavailable_node_is_left_for_the_next_and_other_errors_keep_their_code(tokenizer, model_config):
    running = await start_cluster(tokenizer, model_config, num_prefill=2, routing="load")
    try:
        async def draining(request, context):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "prefill node is draining")

        async def refusing(request, context):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt: too long here")

        for node in running.prefill:
            node.embed_answer = draining
        first, second = running.prefill
        second.embed_answer = second.embed_as_positions
        for _ in range(4):  # whichever the router picks first, the draining one is left for the other
            reply = await running.stub.Embed(gateway_pb2.EmbedRequest(token_ids=[1, 2], normalize=False), timeout=10)
            assert reply.prefill_node == second.address and list(reply.embedding) == [0.0, 1.0]
        assert first.embed_requests, "the router did pick the draining node"

        second.embed_answer = draining  # both: the last failure, UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await running.stub.Embed(gateway_pb2.EmbedRequest(token_ids=[1, 2]), timeout=10)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in failed.value.details()

        for node in running.prefill:
            node.embed_answer, node.embed_requests = refusing, []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await running.stub.Embed(gateway_pb2.EmbedRequest(token_ids=[1, 2]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "too long here" in refused.value.details()
        assert sum(len(n.embed_requests) for n in running.prefill) == 1, "not retried"
    finally:
        await stop_cluster(running)


async def test_a_cancelled_call_cancels_the_nodes_and_a_drain_lets_one_finish(cluster):
    release = asyncio.Event()

    async def slow(request, context):
        await release.wait()
        return await cluster.p.embed_as_positions(request, context)

    cluster.p.embed_answer = slow
    call = cluster.stub.Embed(gateway_pb2.EmbedRequest(token_ids=[1, 2, 3]), timeout=10)
    while not cluster.p.embed_requests:
        await asyncio.sleep(0.01)
    call.cancel()
    while not cluster.p.cancelled:
        await asyncio.sleep(0.01)
    assert cluster.p.cancelled == [cluster.p.embed_requests[0].request_id]

    running = asyncio.ensure_future(cluster.stub.Embed(gateway_pb2.EmbedRequest(token_ids=[1, 2]), timeout=10))
    while len(cluster.p.embed_requests) < 2:
        await asyncio.sleep(0.01)
    assert cluster.gateway.core.in_flight == 1
    draining = asyncio.ensure_future(cluster.gateway.core.drain(grace_s=5))
    await asyncio.sleep(0.2)
    assert not draining.done(), "the drain waits for the embedding in flight"
    release.set()
    assert len((await running).embedding) == 2
    await asyncio.wait_for(draining, 5)



async def test_a_drain_past_its_grace_ends_an_embedding_unavailable(cluster):
    async def hung(request, context):
        await asyncio.Event().wait()

    cluster.p.embed_answer = hung
    call = asyncio.ensure_future(cluster.stub.Embed(gateway_pb2.EmbedRequest(token_ids=[1, 2]), timeout=10))
    while not cluster.p.embed_requests:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(cluster.gateway.core.drain(grace_s=0.2), 5)
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await call
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in ended.value.details()
    while not cluster.p.cancelled:  # and the node's call was cancelled
        await asyncio.sleep(0.01)

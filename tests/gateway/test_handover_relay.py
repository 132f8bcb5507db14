"""A decode node that hands the request to another (``TokenEvent.moved_to``): the gateway attaches there and
the client sees one uninterrupted stream with the right usage; a cancel after the move aborts only there."""

from __future__ import annotations

import asyncio

import pytest
from pdserve.v1 import decode_pb2, gateway_pb2, prefill_pb2

from services.common.sampling_convert import SamplingFields
from services.gateway.generation import GenerateInput
from tests.gateway.conftest import start_cluster, stop_cluster
from tests.gateway.fakes import eventually
from tests.gateway.test_generate import TEXT, collect, request


@pytest.fixture
async def two_decodes(tokenizer, model_config):
    cluster = await start_cluster(tokenizer, model_config, num_decode=2)
    try:
        yield cluster
    finally:
        await stop_cluster(cluster)


def _script_move(cluster, ids, *, stall_after_move: bool = False):
    """The first decode candidate sends ``ids[1:4]`` then hands over; the other sends the rest."""
    first, second = cluster.decode
    cluster.p.first_token = ids[0]

    async def before(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:4])
        yield decode_pb2.TokenEvent(moved_to=second.address)

    async def after(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[4:6])
        if stall_after_move:
            await asyncio.Event().wait()
        yield decode_pb2.TokenEvent(token_ids=ids[6:], finish_reason="length",
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)))

    async def prefill(request, context):  # reserved on the first node, whatever the router's order
        yield prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(decode_address=first.address))
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=ids[0]))
        yield prefill_pb2.PrefillEvent(done=prefill_pb2.Done(num_computed_tokens=len(request.prompt_token_ids)))

    first.script, second.script, cluster.p.script = before, after, prefill
    return first, second


async def test_the_gateway_follows_moved_to_and_the_client_sees_one_stream(two_decodes, tokenizer):
    ids = tokenizer.encode(TEXT)
    first, second = _script_move(two_decodes, ids)
    responses = await collect(two_decodes, request(temperature=0.0, max_tokens=len(ids)))

    assert [t for r in responses for t in r.token_ids] == ids
    assert "".join(r.text for r in responses) == tokenizer.decode(ids)
    assert responses[0].decode_node == first.address
    assert [r.finish_reason for r in responses][-1] == "length" and responses[-1].usage.completion_tokens == len(ids)
    assert sum(bool(r.finish_reason) for r in responses) == 1
    request_id = responses[0].request_id
    assert first.attaches == [request_id] and second.attaches == [request_id]
    await two_decodes.gateway.core.wait_background()
    assert first.aborts == [] and second.aborts == [] and first.cancelled == []
    assert all(n.inflight == 0 for n in two_decodes.gateway.directory.nodes())


async def test_a_cancel_after_the_move_aborts_on_the_adopting_node_only(two_decodes, tokenizer):
    ids = tokenizer.encode(TEXT)
    first, second = _script_move(two_decodes, ids, stall_after_move=True)
    call = two_decodes.stub.Generate(request(temperature=0.0, max_tokens=len(ids)), timeout=10)
    received = []
    while sum(len(r.token_ids) for r in received) < 6:
        received.append(await call.read())
    request_id = received[0].request_id
    call.cancel()
    await eventually(lambda: second.aborts == [request_id], what="Abort on the adopting node")
    await two_decodes.gateway.core.wait_background()
    assert first.aborts == [] and second.cancelled == [request_id]
    assert two_decodes.gateway.core.in_flight == 0


async def test_decode_events_that_came_before_the_first_token_follow_it_in_order(cluster, tokenizer):
    """A decode node can stream before the prefill node's first_token reaches the gateway: those events
    wait, then go right after the first token, before any later one (a regression a review caught)."""
    ids = tokenizer.encode(TEXT)

    async def prefill(req, context):
        yield prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(decode_address=cluster.d.address))
        await asyncio.sleep(0.3)  # the decode node's first events arrive before the first token
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=ids[0]))
        await asyncio.sleep(0.3)  # and one more before done
        yield prefill_pb2.PrefillEvent(done=prefill_pb2.Done(num_computed_tokens=len(req.prompt_token_ids)))

    async def attach(req, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:4])
        await asyncio.sleep(0.45)
        yield decode_pb2.TokenEvent(token_ids=ids[4:], finish_reason="length",
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)))

    cluster.p.script, cluster.d.script = prefill, attach
    responses = await collect(cluster, request(temperature=0.0, max_tokens=len(ids)))
    assert [t for r in responses for t in r.token_ids] == ids
    assert "".join(r.text for r in responses) == tokenizer.decode(ids)


async def open_paused(cluster, ids):
    """A flow whose client read the first chunk and no more: the relay waits at its ``yield``."""
    flow = await cluster.gateway.core.open(
        GenerateInput(prompt="Hi", sampling=SamplingFields(max_tokens=len(ids), temperature=0.0)), None)
    chunks = flow.run()
    first_chunk = await anext(chunks)
    return flow, chunks, first_chunk


async def test_the_adopter_is_attached_while_a_slow_client_has_not_read_up_to_the_move(two_decodes, tokenizer):
    """The adopter drops the tokens of a request nobody attached to after a while (``unread_stream_s``):
    the gateway attaches there when the ``moved_to`` arrives, not when the client has read up to it."""
    ids = tokenizer.encode(TEXT)
    first, second = _script_move(two_decodes, ids)
    flow, chunks, first_chunk = await open_paused(two_decodes, ids)
    try:
        await eventually(lambda: second.attaches == [flow.request_id], what="Attach on the adopter")
        rest = [chunk async for chunk in chunks]
    finally:
        await chunks.aclose()
    assert [t for chunk in [first_chunk, *rest] for t in chunk.token_ids] == ids
    assert rest[-1].finish_reason == "length" and rest[-1].usage.completion_tokens == len(ids)
    await two_decodes.gateway.core.wait_background()
    assert first.aborts == [] and second.aborts == []
    assert all(n.inflight == 0 for n in two_decodes.gateway.directory.nodes())


async def test_a_cancel_before_the_relay_reached_the_move_aborts_the_adopter_only(two_decodes, tokenizer):
    ids = tokenizer.encode(TEXT)
    first, second = _script_move(two_decodes, ids, stall_after_move=True)
    flow, chunks, _ = await open_paused(two_decodes, ids)
    await eventually(lambda: second.attaches == [flow.request_id], what="Attach on the adopter")
    flow.cancel("client gone")
    await chunks.aclose()
    await eventually(lambda: second.aborts == [flow.request_id], what="Abort on the adopting node")
    await two_decodes.gateway.core.wait_background()
    assert first.aborts == [] and second.cancelled == [flow.request_id]
    assert two_decodes.gateway.core.in_flight == 0
    assert all(n.inflight == 0 for n in two_decodes.gateway.directory.nodes())


async def test_a_move_before_the_first_token_is_followed_in_order(two_decodes, tokenizer):
    """The decode node hands the request over before the prefill node's first token reached the gateway:
    the adopter's events (attached to at once) wait with the old node's, and all follow the first token."""
    ids = tokenizer.encode(TEXT)
    first, second = _script_move(two_decodes, ids)

    async def prefill(request, context):
        yield prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(decode_address=first.address))
        await eventually(lambda: second.attaches != [], what="Attach on the adopter")  # both streamed already
        await asyncio.sleep(0.1)
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(token_id=ids[0]))
        yield prefill_pb2.PrefillEvent(done=prefill_pb2.Done(num_computed_tokens=len(request.prompt_token_ids)))

    two_decodes.p.script = prefill
    responses = await collect(two_decodes, request(temperature=0.0, max_tokens=len(ids)))
    assert [t for r in responses for t in r.token_ids] == ids
    assert responses[-1].finish_reason == "length" and responses[-1].usage.completion_tokens == len(ids)
    await two_decodes.gateway.core.wait_background()
    assert first.aborts == [] and second.aborts == []
    assert all(n.inflight == 0 for n in two_decodes.gateway.directory.nodes())

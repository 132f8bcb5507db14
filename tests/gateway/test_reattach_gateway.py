"""A decode leg whose ``Attach`` call breaks mid-stream (no ``pdserve-attach-final`` mark: the node did not
end it) is attached again with ``resume_after`` = the tokens already read from the node, and the client's
stream is complete and in order; an error the node ends the call with itself is not retried; a re-attach
the node refuses fails the request with the break's error. Fake nodes, the in-process gateway."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from pdserve.v1 import decode_pb2, gateway_pb2

from tests.gateway.conftest import start_cluster, stop_cluster
from tests.gateway.test_generate import collect, failure, request

TEXT = " The lighthouse keeper counted every ship that passed the rocks that night."


@pytest.fixture
async def cluster(tokenizer, model_config):
    cluster = await start_cluster(tokenizer, model_config)
    yield cluster
    await stop_cluster(cluster)


def _script(cluster, tokenizer, breaks_after: list[int], refuse_resume: bool = False) -> list[int]:
    """P answers the first token of TEXT; D sends the rest one token per event from ``resume_after``, its
    n-th call breaking (no final mark) after ``breaks_after[n]`` tokens of its own; ``refuse_resume``: a
    resuming call is refused NOT_FOUND by the node itself."""
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]
    decoded = ids[1:]

    async def attach(request, context):
        call = len(cluster.d.attaches) - 1
        if refuse_resume and request.resume_after:
            await context.abort(grpc.StatusCode.NOT_FOUND, "decode node holds no request to attach to")
        for sent, token in enumerate(decoded[request.resume_after:]):
            if call < len(breaks_after) and sent == breaks_after[call]:
                context.set_trailing_metadata(())  # a broken call: not the node's own answer
                await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            last = request.resume_after + sent == len(decoded) - 1
            yield decode_pb2.TokenEvent(token_ids=[token], finish_reason="length" if last else "",
                                        usage=gateway_pb2.Usage(completion_tokens=len(ids)) if last else None)

    cluster.d.script = attach
    return ids


async def test_a_broken_decode_call_is_reattached_and_the_client_gets_every_token_once_in_order(cluster, tokenizer):
    ids = _script(cluster, tokenizer, breaks_after=[3, 0, 4])  # the second call breaks before any event
    responses = await collect(cluster, request(temperature=0.0, max_tokens=len(ids)), timeout=20)
    assert [t for r in responses for t in r.token_ids] == ids
    assert "".join(r.text for r in responses) == tokenizer.decode(ids)
    assert responses[-1].finish_reason == "length"
    assert cluster.d.resume_after == [0, 3, 3, 7]
    assert cluster.d.aborts == []  # the request finished there: nothing to abort


async def test_an_error_the_node_ends_the_call_with_is_not_retried(cluster, tokenizer):
    ids = tokenizer.encode(TEXT)
    cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine failed: test")  # final: as a real node's

    cluster.d.script = attach
    error = await failure(cluster, request(temperature=0.0, max_tokens=len(ids)), timeout=20)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "the engine failed: test" in error.details()
    assert cluster.d.resume_after == [0]


async def test_a_reattach_the_node_refuses_fails_the_request_with_the_break(cluster, tokenizer):
    ids = _script(cluster, tokenizer, breaks_after=[2], refuse_resume=True)
    error = await failure(cluster, request(temperature=0.0, max_tokens=len(ids)), timeout=20)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "Socket closed" in error.details()
    assert cluster.d.resume_after == [0, 2]

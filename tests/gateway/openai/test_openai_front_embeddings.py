"""``/v1/embeddings`` over fake prefill nodes: the body's forms reach the nodes as token ids and come back in order,
pooled and encoded as asked (base64: little-endian float32); a failing input fails the request naming it; a client
that leaves cancels its inputs on the nodes."""

from __future__ import annotations

import asyncio
import base64
import struct

import grpc
import pytest

from tests.gateway.fakes import eventually
from tests.gateway.openai.conftest import MODEL


async def test_every_form_of_input_comes_back_in_order_pooled_and_encoded(front, tokenizer):
    texts = ["Hello", "Hello there, general"]
    answer = await front.client.embeddings.create(model=MODEL, input=texts, encoding_format="float",
                                                  extra_body={"normalize": False})
    assert [d.embedding for d in answer.data] == [[float(i) for i in range(len(tokenizer.encode(t)))] for t in texts]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(len(tokenizer.encode(t)) for t in texts)
    sent = sorted(list(r.prompt_token_ids) for r in front.cluster.p.embed_requests)
    assert sent == sorted(tokenizer.encode(t) for t in texts)

    reply = await front.http.post("/v1/embeddings", json={"input": [[3, 4, 5]], "encoding_format": "base64",
                                                          "dimensions": 2})
    (data,) = reply.json()["data"]
    assert struct.unpack("<2f", base64.b64decode(data["embedding"])) == (0.0, 1.0)
    assert reply.json()["model"] == MODEL and reply.headers["x-request-id"].startswith("embd-")


async def test_a_failing_input_fails_the_request_naming_its_status(front):
    async def refusing(request, context):
        if len(request.prompt_token_ids) == 2:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room here")
        return await front.cluster.p.embed_as_positions(request, context)

    front.cluster.p.embed_answer = refusing
    reply = await front.http.post("/v1/embeddings", json={"input": [[1, 2, 3], [1, 2]]})
    assert reply.status_code == 429 and "no room here" in reply.json()["error"]["message"]
    wrong = await front.http.post("/v1/embeddings", json={"input": "Hello", "model": "other"})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"


async def test_a_client_leaving_cancels_its_inputs_on_the_nodes(front):
    async def hung(request, context):
        await asyncio.Event().wait()

    front.cluster.p.embed_answer = hung
    waiting = asyncio.ensure_future(front.http.post("/v1/embeddings", json={"input": [[1, 2], [3, 4, 5]]}))
    await eventually(lambda: len(front.cluster.p.embed_requests) == 2, what="both inputs on the node")
    waiting.cancel()  # closes the connection
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await eventually(lambda: len(front.cluster.p.cancelled) == 2, what="both node calls cancelled")
    await eventually(lambda: front.cluster.gateway.core.in_flight == 0, what="nothing in flight")

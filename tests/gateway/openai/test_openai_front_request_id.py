"""``X-Request-Id``: a client's id is honoured (the response's ``id`` and the request id the nodes see, as
vLLM has them) and echoed; without one the response still carries the id it got; a bad one is a 400."""

from __future__ import annotations

from tests.gateway.openai.conftest import MODEL
from tests.gateway.openai.test_openai_front_api import script

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def test_a_clients_request_id_is_honoured_and_echoed(front, tokenizer):
    script(front, tokenizer)
    reply = await front.http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "trace-42"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-request-id"] == "trace-42" and reply.json()["id"] == "chatcmpl-trace-42"
    assert front.cluster.p.requests[-1].request_id.startswith("chatcmpl-trace-42")


async def test_without_one_the_generated_id_is_echoed(front, tokenizer):
    script(front, tokenizer)
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-request-id"] == reply.json()["id"] and reply.json()["id"].startswith("cmpl-")


async def test_a_bad_request_id_is_refused_naming_the_header(front):
    reply = await front.http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "x" * 200})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "X-Request-Id"
    assert not front.cluster.p.requests

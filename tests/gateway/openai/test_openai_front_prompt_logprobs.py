"""Completions' ``echo`` and prompt logprobs on the HTTP front, over fake nodes: the echoed prompt leads the
text (and, with ``logprobs``, the logprobs lists, its first token's entry None), and vLLM's
``prompt_logprobs`` has one entry per prompt token in vLLM's shape; what reaches the prefill node asks for
them."""

from __future__ import annotations

import json

from pdserve.v1 import gateway_pb2

from tests.gateway.openai.conftest import MODEL, Front
from tests.gateway.openai.test_openai_front_api import script, sse_events

PROMPT = "Hello there, my friend"


def fake_prompt_logprobs(front: Front, tokenizer, k: int) -> list[int]:
    """The prefill node answers logprobs for the prompt's tokens after the first: token i's is -i/10, its
    rank i, and its k most likely are tokens 5, 6, … at -0.01, -0.02, …"""
    ids = tokenizer.encode(PROMPT)
    front.cluster.p.prompt_logprobs = [
        gateway_pb2.TokenLogprob(token_id=t, logprob=-i / 10, rank=i,
                                 top=[gateway_pb2.TopLogprob(token_id=5 + j, logprob=-(j + 1) / 100) for j in range(k)])
        for i, t in enumerate(ids[1:], 1)]
    return ids


async def _post(front: Front, **body) -> dict:
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_echo_puts_the_prompt_text_first(front, tokenizer):
    ids = script(front, tokenizer)
    (choice,) = (await _post(front, max_tokens=len(ids), echo=True))["choices"]
    assert choice["text"] == PROMPT + tokenizer.decode(ids)
    assert front.cluster.p.requests[-1].sampling.HasField("prompt_logprobs") is False  # no logprobs: none computed

    ids = script(front, tokenizer)  # streamed: the first chunk carries it
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": len(ids),
                                                           "echo": True, "stream": True})
    chunks = [json.loads(e) for e in sse_events(reply.text) if e != "[DONE]"]
    assert chunks[0]["choices"][0]["text"].startswith(PROMPT)
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT + tokenizer.decode(ids)


async def test_echo_with_logprobs_leads_the_lists_with_the_prompt_tokens(front, tokenizer):
    ids = script(front, tokenizer)
    prompt_ids = fake_prompt_logprobs(front, tokenizer, k=3)
    front.cluster.p.first_logprob = gateway_pb2.TokenLogprob(token_id=ids[0], logprob=-0.5)  # the new tokens':
    (choice,) = (await _post(front, max_tokens=len(ids), echo=True, logprobs=1))["choices"]  # the first only
    assert front.cluster.p.requests[-1].sampling.prompt_logprobs == 1
    lists = choice["logprobs"]
    n = len(prompt_ids)
    assert lists["tokens"][:n] == [tokenizer.decode([t], skip_special_tokens=False) for t in prompt_ids]
    assert lists["token_logprobs"][0] is None and lists["top_logprobs"][0] is None
    assert [round(value, 6) for value in lists["token_logprobs"][1:n]] == [round(-i / 10, 6) for i in range(1, n)]
    assert [len(top) for top in lists["top_logprobs"][1:n]] == [2] * (n - 1)  # the token and the 1 most likely
    assert lists["tokens"][n:] == [tokenizer.decode(ids[:1])] and lists["token_logprobs"][n] == -0.5
    offsets = lists["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[n] == len(PROMPT)  # then the completion


async def test_prompt_logprobs_in_vllm_shape(front, tokenizer):
    ids = script(front, tokenizer)
    prompt_ids = fake_prompt_logprobs(front, tokenizer, k=2)
    (choice,) = (await _post(front, max_tokens=len(ids), prompt_logprobs=2))["choices"]
    assert choice["text"] == tokenizer.decode(ids)  # not echoed
    shown = choice["prompt_logprobs"]
    assert len(shown) == len(prompt_ids) and shown[0] is None
    for i, (token_id, entry) in enumerate(zip(prompt_ids[1:], shown[1:], strict=True), 1):
        assert set(entry) == {str(token_id), "5", "6"}
        assert entry[str(token_id)]["rank"] == i and abs(entry[str(token_id)]["logprob"] + i / 10) < 1e-6
        assert entry[str(token_id)]["decoded_token"] == tokenizer.decode([token_id], skip_special_tokens=False)
        assert entry["5"]["rank"] == 1 and entry["6"]["rank"] == 2
    assert front.cluster.p.requests[-1].sampling.prompt_logprobs == 2


async def test_chat_prompt_logprobs_are_the_rendered_prompt_s_at_the_response_s_top(front, tokenizer):
    """vLLM's chat shape: ``prompt_logprobs`` beside the choices, one entry per token of the prompt the chat
    template rendered (the first None)."""
    messages = [{"role": "user", "content": "Hi"}]
    ids = script(front, tokenizer)
    plain = await front.http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                                "max_tokens": len(ids)})
    assert plain.status_code == 200 and plain.json()["prompt_logprobs"] is None
    rendered = list(front.cluster.p.requests[-1].prompt_token_ids)
    assert not front.cluster.p.requests[-1].sampling.HasField("prompt_logprobs")
    ids = script(front, tokenizer)
    front.cluster.p.prompt_logprobs = [
        gateway_pb2.TokenLogprob(token_id=t, logprob=-i / 10, rank=i, top=[gateway_pb2.TopLogprob(token_id=5,
                                                                                                  logprob=-0.01)])
        for i, t in enumerate(rendered[1:], 1)]
    reply = await front.http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                                "max_tokens": len(ids), "prompt_logprobs": 1})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert front.cluster.p.requests[-1].sampling.prompt_logprobs == 1
    assert body["choices"][0]["message"]["content"] == tokenizer.decode(ids)
    shown = body["prompt_logprobs"]
    assert len(shown) == len(rendered) == body["usage"]["prompt_tokens"] and shown[0] is None
    for i, (token_id, entry) in enumerate(zip(rendered[1:], shown[1:], strict=True), 1):
        assert set(entry) == {str(token_id), "5"} and abs(entry[str(token_id)]["logprob"] + i / 10) < 1e-6


async def test_prompt_logprobs_out_of_range_or_streamed_on_chat_are_refused(front, tokenizer):
    chat = [{"role": "user", "content": "Hi"}]
    for body, param in (({"prompt": PROMPT, "prompt_logprobs": 21}, "prompt_logprobs"),
                        ({"messages": chat, "prompt_logprobs": 21}, "prompt_logprobs"),
                        ({"messages": chat, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
                        ({"messages": chat, "echo": True}, "echo")):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        reply = await front.http.post(path, json={"model": MODEL, **body})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param
    assert front.cluster.p.requests == []


async def test_an_echoed_prompt_is_the_string_sent_special_tokens_and_all(front, tokenizer):
    chat = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = script(front, tokenizer)
    front.cluster.p.first_logprob = gateway_pb2.TokenLogprob(token_id=ids[0], logprob=-0.5)
    prompt_ids = tokenizer.encode(chat)
    front.cluster.p.prompt_logprobs = [gateway_pb2.TokenLogprob(token_id=t, logprob=-1.0) for t in prompt_ids[1:]]
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": chat, "max_tokens": len(ids),
                                                           "echo": True, "logprobs": 0})
    (choice,) = reply.json()["choices"]
    assert choice["text"] == chat + tokenizer.decode(ids)
    offsets = choice["logprobs"]["text_offset"]
    assert offsets[len(prompt_ids)] == len(chat)  # the first new token's text starts where the prompt's ends
    by_ids = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt_ids, "max_tokens": 1,
                                                            "echo": True})
    assert by_ids.json()["choices"][0]["text"].startswith(chat)  # token ids: their text, special tokens too


async def test_a_prefill_node_that_returns_no_prompt_logprobs_is_an_error_not_a_short_list(front, tokenizer):
    """A node of an earlier version ignores the field: the client is told, not given a list of one."""
    script(front, tokenizer)
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4,
                                                           "prompt_logprobs": 1})
    assert reply.status_code in (502, 503), reply.text
    assert "prompt logprobs for a prompt of" in reply.json()["error"]["message"]

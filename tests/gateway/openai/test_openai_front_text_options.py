"""vLLM's text options on the HTTP front, over fake nodes: ``include_stop_str_in_output`` keeps the stop
string (or the stop token) in the text, ``skip_special_tokens: false`` shows special tokens; the tokens and
the usage are the same either way."""

from __future__ import annotations

import json

from pdserve.v1 import decode_pb2, gateway_pb2

from services.engine.tokenizer import ChatMessage
from tests.gateway.conftest import MAX_MODEL_LEN
from tests.gateway.openai.conftest import MODEL, Front
from tests.gateway.openai.test_openai_front_api import sse_events

TEXT = " The quick brown fox jumps over the lazy dog."


def script_ids(front: Front, ids: list[int], finish_reason: str) -> None:
    """P answers ``ids[0]``; D the rest in two events, the last finishing with ``finish_reason``."""
    front.cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        yield decode_pb2.TokenEvent(token_ids=ids[3:], finish_reason=finish_reason,
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)))

    front.cluster.d.script = attach


async def _completion(front: Front, **extra) -> tuple[str, str, int]:
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 32, **extra})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    (choice,) = body["choices"]
    return choice["text"], choice["finish_reason"], body["usage"]["completion_tokens"]


async def test_a_stop_string_is_kept_in_the_text_with_include_stop_str_in_output(front, tokenizer):
    ids = tokenizer.encode(TEXT)
    script_ids(front, ids, "length")
    cut = await _completion(front, stop=[" fox"])
    script_ids(front, ids, "length")
    kept = await _completion(front, stop=[" fox"], include_stop_str_in_output=True)
    assert cut[:2] == (" The quick brown", "stop")
    assert kept[:2] == (" The quick brown fox", "stop")
    assert kept[2] == cut[2] < len(ids)  # the same tokens: up to the one that completed the stop string

    script_ids(front, ids, "length")  # streamed: no stop string half sent, and nothing after it
    reply = await front.http.post("/v1/completions", json={
        "model": MODEL, "prompt": "Hi", "max_tokens": 32, "stop": [" fox"], "include_stop_str_in_output": True,
        "stream": True})
    chunks = [json.loads(e) for e in sse_events(reply.text) if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == " The quick brown fox"


async def test_special_tokens_are_text_with_skip_special_tokens_false(front, tokenizer):
    eos = tokenizer.eos_token_ids[0]
    start = tokenizer.hf.convert_tokens_to_ids("<|im_start|>")
    ids = [start, *tokenizer.encode(" ok then"), eos]
    spelled = tokenizer.hf.convert_ids_to_tokens(eos)
    shown = {}
    for name, extra in (("default", {}), ("kept", {"skip_special_tokens": False}),
                        ("with the end", {"skip_special_tokens": False, "include_stop_str_in_output": True})):
        script_ids(front, ids, "stop")
        shown[name] = await _completion(front, **extra)
    assert shown == {"default": (" ok then", "stop", len(ids)),
                     "kept": ("<|im_start|> ok then", "stop", len(ids)),  # the end of sequence that stopped it: not
                     "with the end": (f"<|im_start|> ok then{spelled}", "stop", len(ids))}
    # what reached the nodes: the sampling params say it too (a node's in-process text would follow them)
    assert front.cluster.p.requests[-1].sampling.skip_special_tokens is False
    assert front.cluster.p.requests[-1].sampling.include_stop_str_in_output is True


async def test_chat_content_shows_special_tokens_with_skip_special_tokens_false(front, tokenizer):
    start = tokenizer.hf.convert_tokens_to_ids("<|im_start|>")
    ids = [*tokenizer.encode("Sure"), start, *tokenizer.encode(" more")]
    script_ids(front, ids, "length")
    reply = await front.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32,
        "skip_special_tokens": False})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "Sure<|im_start|> more"


async def test_truncate_prompt_tokens_keeps_the_prompt_s_last_tokens(front, tokenizer):
    ids = tokenizer.encode(TEXT)
    long_prompt = tokenizer.encode("one two three four five six seven eight nine ten")
    for prompt, body in ((long_prompt, {"prompt": long_prompt}),
                         (tokenizer.encode("one two three four"), {"prompt": "one two three four"})):
        script_ids(front, ids, "length")
        reply = await front.http.post("/v1/completions", json={"model": MODEL, "max_tokens": 32,
                                                               "truncate_prompt_tokens": 3, **body})
        assert reply.status_code == 200, reply.text
        assert list(front.cluster.p.requests[-1].prompt_token_ids) == prompt[-3:]
        assert reply.json()["usage"]["prompt_tokens"] == 3
    script_ids(front, ids, "length")  # chat: the templated prompt's last tokens (vLLM's left truncation)
    messages = [{"role": "user", "content": "Hi"}]
    reply = await front.http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 32, "messages": messages,
                                                                "truncate_prompt_tokens": 2})
    assert reply.status_code == 200, reply.text
    templated = tokenizer.apply_chat_template([ChatMessage("user", "Hi")])
    assert list(front.cluster.p.requests[-1].prompt_token_ids) == templated[-2:]
    script_ids(front, ids, "length")  # token ids past the context: truncated first, so served
    too_long = [5 + i % 100 for i in range(MAX_MODEL_LEN + 10)]
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "max_tokens": 4, "prompt": too_long,
                                                           "truncate_prompt_tokens": 8})
    assert reply.status_code == 200 and list(front.cluster.p.requests[-1].prompt_token_ids) == too_long[-8:]
    script_ids(front, ids, "length")  # -1: the context less max_tokens (vLLM's)
    reply = await front.http.post("/v1/completions", json={"model": MODEL, "max_tokens": 4, "prompt": too_long,
                                                           "truncate_prompt_tokens": -1})
    assert reply.status_code == 200 and list(front.cluster.p.requests[-1].prompt_token_ids) == too_long[-(
        MAX_MODEL_LEN - 4):]
    for prompt, echoed in (("one two", "one two"), ("one two three four five", " four five")):
        script_ids(front, ids, "length")  # echo: the prompt as sent, or what truncation kept of it
        reply = await front.http.post("/v1/completions", json={"model": MODEL, "max_tokens": 4, "prompt": prompt,
                                                               "echo": True, "truncate_prompt_tokens": 2})
        assert reply.json()["choices"][0]["text"].startswith(echoed), (prompt, reply.text)
    reply = await front.http.post("/tokenize", json={"model": MODEL, "prompt": "Hi", "truncate_prompt_tokens": 1})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "truncate_prompt_tokens"
    for bad in (0, -2, MAX_MODEL_LEN + 1):
        reply = await front.http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi",
                                                               "truncate_prompt_tokens": bad})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "truncate_prompt_tokens", reply.text

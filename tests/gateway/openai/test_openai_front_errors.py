"""Every way a request can fail at the HTTP front gets OpenAI's error shape with the right status and
``param``, no node is called for bad input, and the gateway serves the next request."""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import openai
import pytest
from pdserve.v1 import decode_pb2, prefill_pb2

from services.engine.tokenizer import ChatMessage
from tests.gateway.conftest import MAX_MODEL_LEN
from tests.gateway.fakes import eventually
from tests.gateway.openai.conftest import MAX_BODY_MIB, MODEL, Front, start_front, stop_front
from tests.gateway.openai.test_openai_front_api import TEXT, script, sse_events

CHAT = [{"role": "user", "content": "Hi"}]


async def assert_serving(front: Front, tokenizer) -> None:
    """A normal request still works, and nothing is left in flight at the gateway."""
    ids = script(front, tokenizer)
    completion = await front.client.completions.create(model=MODEL, prompt="Hello", max_tokens=len(ids))
    assert completion.choices[0].text == tokenizer.decode(ids)
    await front.cluster.gateway.core.wait_background()
    assert front.cluster.gateway.core.in_flight == 0


def error_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


BAD_COMPLETIONS = [  # (body, param)
    ({"model": MODEL}, "prompt"),
    ({"prompt": ["a", 5]}, "prompt"),
    ({"prompt": ["a", [1, "b"]]}, "prompt"),
    ({"prompt": ["Hi"] * 33, "n": 2}, "prompt"),  # 66 requests: past the 64 of one call
    ({"prompt": ["Hi", ""]}, "prompt"),  # the gateway refuses the second: the first is never sent either
    ({"prompt": ["Hi", [10**9]]}, "prompt"),
    ({"prompt": {"text": "a"}}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": [1] * MAX_MODEL_LEN}, "prompt"),
    ({"prompt": [1] * 100, "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "Hi", "n": 0}, "n"),
    ({"prompt": "Hi", "n": 17}, "n"),
    ({"prompt": "Hi", "echo": "twice"}, "echo"),
    ({"prompt": "Hi", "logprobs": 21}, "logprobs"),
    ({"prompt": "Hi", "best_of": 2}, "best_of"),
    ({"prompt": "Hi", "suffix": "end"}, "suffix"),
    ({"prompt": "Hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "Hi", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "Hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "Hi", "repetition_penalty": 1e300}, "repetition_penalty"),
    ({"prompt": "Hi", "min_p": 1.5}, "min_p"),
    ({"prompt": "Hi", "logit_bias": {"one": 5}}, "logit_bias"),
    ({"prompt": "Hi", "logit_bias": {"²": 5}}, "logit_bias"),  # a digit int() does not read: was a 500
    ({"prompt": "Hi", "logit_bias": {"1": 500}}, "logit_bias"),
    ({"prompt": "Hi", "logit_bias": {"99999999999": 5}}, "logit_bias"),
    ({"prompt": "Hi", "temperature": -1}, "temperature"),
    ({"prompt": "Hi", "top_p": 0}, "top_p"),
    ({"prompt": "Hi", "top_k": -2}, "top_k"),
    ({"prompt": "Hi", "seed": -1}, "seed"),
    ({"prompt": "Hi", "stop": 5}, "stop"),
    ({"prompt": "Hi", "stop": [""]}, "stop"),
    ({"prompt": "Hi", "stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"prompt": "Hi", "allowed_token_ids": [1, 10**9]}, "allowed_token_ids"),
    ({"prompt": "Hi", "allowed_token_ids": "1"}, "allowed_token_ids"),
    ({"prompt": "Hi", "allowed_token_ids": []}, "allowed_token_ids"),
    ({"prompt": "Hi", "bad_words": ["fine", " "]}, "bad_words"),
    ({"prompt": "Hi", "bad_words": "Paris"}, "bad_words"),
    ({"prompt": "Hi", "bad_words": ["fine \ud800"]}, "bad_words"),  # no UTF-8 form: the tokenizer would fail
    ({"prompt": "Hi", "stream": "maybe"}, "stream"),
    # what the wire to the nodes (int32, float32, UTF-8) cannot carry is refused here, naming the field
    ({"prompt": "Hi", "top_k": 2**31}, "top_k"),
    ({"prompt": "Hi", "top_k": 1e20}, "top_k"),
    ({"prompt": "Hi", "temperature": 1e300}, "temperature"),
    ({"prompt": "Hi", "temperature": float("nan")}, "temperature"),
    ({"prompt": "Hi", "top_p": 1e-50}, "top_p"),
    ({"prompt": "hi \ud800 there"}, "prompt"),
    ({"prompt": "Hi", "stop": ["\udfff"]}, "stop"),
    # what would change the output and pdserve does not do: refused, never silently ignored
    ({"prompt": "Hi", "logprobs": -1}, "logprobs"),
    ({"prompt": "Hi", "response_format": {"type": "xml"}}, "response_format.type"),
    ({"prompt": "Hi", "guided_choice": []}, "guided_choice"),
    ({"prompt": "Hi", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"prompt": "Hi", "min_tokens": -1}, "min_tokens"),
    ({"prompt": "Hi", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"prompt": "Hi", "include_stop_str_in_output": "yes please"}, "include_stop_str_in_output"),
    ({"prompt": "Hi", "spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ({"prompt": "Hi", "prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt": "Hi", "max_completion_tokens": 3}, "max_completion_tokens"),  # chat's: it was ignored here
    ({"prompt": "Hi", "prompt_embeds": "AAAA"}, "prompt_embeds"),
    ({"prompt": "Hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),  # chat's
    ({"prompt": "Hi", "stream": True, "stream_options": {"continuous_usage_stats": "every chunk"}},
     "stream_options.continuous_usage_stats"),
    ({"prompt": "Hi", "logprobs": 1, "return_tokens_as_token_ids": "as ids"}, "return_tokens_as_token_ids"),
    ({"prompt": "Hi", "stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
]
BAD_CHATS = [
    ({"model": MODEL}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "Hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": CHAT, "n": 17}, "n"),
    ({"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages[0].content"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
    ({"messages": CHAT, "tool_choice": "required"}, "tool_choice"),  # and no tools
    ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format.json_schema.name"),
    ({"messages": CHAT, "continue_final_message": True}, "continue_final_message"),  # and add_generation_prompt
    ({"messages": CHAT, "add_generation_prompt": "yes please"}, "add_generation_prompt"),
    ({"messages": CHAT, "echo": True}, "echo"),
    ({"messages": CHAT, "chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ({"messages": CHAT, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ({"messages": CHAT, "best_of": 3}, "best_of"),
    ({"messages": CHAT, "stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize(("path", "cases"), [("/v1/completions", BAD_COMPLETIONS),
                                             ("/v1/chat/completions", BAD_CHATS)])
async def test_bad_input_is_400_naming_the_field_and_calls_no_node(front, tokenizer, path, cases):
    for body, param in cases:
        for stream in (False, True):
            reply = await front.http.post(path, content=json.dumps({"stream": stream, **body}),  # \ud800 escaped
                                          headers={"Content-Type": "application/json"})
            error = error_of(reply, 400)
            assert (error["type"], error["param"]) == ("invalid_request_error", param), (body, error)
            assert error["message"].startswith(f"{param}:") or param == "prompt", (body, error)
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)


async def test_null_and_neutral_values_mean_the_defaults(front, tokenizer):
    """OpenAI clients send ``null`` for unset fields, and the neutral value of what pdserve does not do
    changes nothing: both are served as if absent."""
    ids = script(front, tokenizer)
    neutral = {"n": None, "stream": None, "presence_penalty": None, "frequency_penalty": None,
               "ignore_eos": None, "response_format": {"type": "text"}, "tool_choice": "none", "tools": [],
               "min_p": 0, "repetition_penalty": 1.0, "skip_special_tokens": True, "min_tokens": 0,
               "user": "someone", "metadata": {"team": "a"}, "store": False}
    reply = await front.http.post("/v1/completions", json={"prompt": "Hi", "echo": None, "logprobs": None,
                                                           "max_tokens": len(ids), **neutral})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == tokenizer.decode(ids)
    script(front, tokenizer)
    reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT, "logprobs": None, "best_of": 1,
                                                                "max_tokens": len(ids), **neutral})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == tokenizer.decode(ids)


async def test_a_message_without_content_is_an_empty_message(front, tokenizer):
    """An assistant turn that only called a tool has no ``content``: it is served (was a 500)."""
    ids = script(front, tokenizer)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant"}, {"role": "user", "content": "Again"}]
    reply = await front.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": len(ids)})
    assert reply.status_code == 200, reply.text
    expected = tokenizer.apply_chat_template([ChatMessage("user", "Hi"), ChatMessage("assistant", ""),
                                              ChatMessage("user", "Again")])
    assert list(front.cluster.p.requests[0].prompt_token_ids) == expected


async def test_malformed_json_is_400(front, tokenizer):
    for content in (b'{"prompt": "Hi",', b"not json", b"[1, 2]", b""):
        reply = await front.http.post("/v1/completions", content=content,
                                      headers={"Content-Type": "application/json"})
        error = error_of(reply, 400)
        assert (error["type"], error["param"]) == ("invalid_request_error", None), (content, error)
    await assert_serving(front, tokenizer)


async def test_a_body_json_cannot_read_says_why(front, tokenizer):
    for content, reason in ((b'{"prompt": "H\xff"}', "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"),
                            (b"[" * 200_000, "RecursionError: maximum recursion depth exceeded")):
        reply = await front.http.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
        error = error_of(reply, 400)
        assert error["message"].startswith(f"malformed JSON body: {reason}"), error
    await assert_serving(front, tokenizer)


async def test_messages_name_what_is_wrong(front, tokenizer):
    async def message(body: dict, path: str = "/v1/completions", content_type: str | None = "application/json") -> str:
        headers = {"Content-Type": content_type} if content_type else {}
        reply = await front.http.post(path, content=json.dumps(body).encode(), headers=headers)
        return error_of(reply, 400)["message"]

    body = {"prompt": "Hi"}
    assert "Content-Type: application/json, got 'text/plain'" in await message(body, content_type="text/plain")
    assert "Content-Type" in await message(body, content_type=None)
    assert "is not a finite number" not in await message({"prompt": "Hi", "temperature": 0.5, "top_p": 2})
    assert "finite number" in await message({"prompt": "Hi", "temperature": float("nan")})
    assert await message({"prompt": [[]]}) == "prompt: is empty"  # the gateway's token_ids, named as sent
    part = await message({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "/v1/chat/completions")
    assert "part 0: a text part's 'text' must be a string, got None" in part
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)


async def test_an_unknown_model_is_404_model_not_found(front, tokenizer):
    with pytest.raises(openai.NotFoundError) as raised:
        await front.client.completions.create(model="gpt-7", prompt="Hi")
    assert (raised.value.status_code, raised.value.code, raised.value.param) == (404, "model_not_found", "model")
    with pytest.raises(openai.NotFoundError):
        await front.client.chat.completions.create(model="gpt-7", messages=CHAT, stream=True)
    with pytest.raises(openai.NotFoundError):
        await front.client.models.retrieve("gpt-7")
    await assert_serving(front, tokenizer)


async def test_the_openai_client_sees_bad_requests_as_bad_request_errors(front, tokenizer):
    with pytest.raises(openai.BadRequestError) as raised:
        await front.client.completions.create(model=MODEL, prompt="Hi", max_tokens=-1)
    assert (raised.value.status_code, raised.value.param, raised.value.type) == (
        400, "max_tokens", "invalid_request_error")
    with pytest.raises(openai.BadRequestError) as raised:
        await front.client.chat.completions.create(model=MODEL, messages=CHAT, n=17)
    assert raised.value.param == "n"
    await assert_serving(front, tokenizer)


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_is_413(front, tokenizer, chunked):
    body = json.dumps({"model": MODEL, "prompt": "x" * int(MAX_BODY_MIB * (1 << 20))}).encode()

    async def pieces():
        for start in range(0, len(body), 1 << 16):
            yield body[start:start + (1 << 16)]

    reply = await front.http.post("/v1/completions", content=pieces() if chunked else body,
                                  headers={"Content-Type": "application/json"})
    error = error_of(reply, 413)
    assert "exceeds the limit" in error["message"]
    assert (error["code"], error["param"]) == ("request_too_large", "body")
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)


async def test_unknown_routes_and_methods_keep_the_shape(front):
    assert error_of(await front.http.get("/v1/engines"), 404)["type"] == "not_found_error"
    assert error_of(await front.http.get("/v1/completions"), 405)["message"]


@pytest.mark.parametrize(("code", "status"), [
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 429), (grpc.StatusCode.INVALID_ARGUMENT, 400),
    (grpc.StatusCode.UNAVAILABLE, 503), (grpc.StatusCode.DEADLINE_EXCEEDED, 504), (grpc.StatusCode.INTERNAL, 502)])
async def test_a_prefill_error_before_the_first_token_has_its_status(front, tokenizer, code, status):
    async def prefill(request, context):
        await context.abort(code, "every decode candidate refused")
        yield prefill_pb2.PrefillEvent()

    front.cluster.p.script = prefill
    for stream in (False, True):
        reply = await front.http.post("/v1/completions", json={"prompt": "Hi", "stream": stream})
        assert "every decode candidate refused" in error_of(reply, status)["message"]
    front.cluster.p.script = front.cluster.p.well_behaved
    await assert_serving(front, tokenizer)


async def test_no_healthy_node_is_503(front, tokenizer):
    front.cluster.p.status.healthy = False  # what a draining node reports
    await eventually(lambda: not front.cluster.gateway.directory.nodes("prefill")[0].healthy, what="poll")
    with pytest.raises(openai.InternalServerError) as raised:
        await front.client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
    assert raised.value.status_code == 503 and "no healthy prefill node" in raised.value.message
    front.cluster.p.status.healthy = True
    await eventually(lambda: front.cluster.gateway.directory.nodes("prefill")[0].healthy, what="poll")
    await assert_serving(front, tokenizer)


async def test_a_decode_node_failing_mid_stream_is_an_error_event_then_done(front, tokenizer):
    ids = tokenizer.encode(TEXT)
    front.cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        await context.abort(grpc.StatusCode.INTERNAL, "decode step crashed")

    front.cluster.d.script = attach
    reply = await front.http.post("/v1/completions", json={"prompt": "Hi", "stream": True})
    assert reply.status_code == 200
    *chunks, error, done = sse_events(reply.text)
    assert done == "[DONE]"
    assert "".join(json.loads(c)["choices"][0]["text"] for c in chunks) == tokenizer.decode(ids[:3])
    assert json.loads(error)["error"]["code"] == "service_unavailable"
    assert "decode step crashed" in json.loads(error)["error"]["message"]

    front.cluster.d.script = attach
    reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT})  # not streamed: a 503
    assert "decode node" in error_of(reply, 503)["message"]
    await eventually(lambda: front.cluster.gateway.directory.nodes("decode")[0].healthy, what="decode back")
    await assert_serving(front, tokenizer)


async def test_a_passed_deadline_is_504_and_frees_the_request(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, request_timeout_s=0.5)
    try:
        ids = tokenizer.encode(TEXT)
        front.cluster.p.first_token = ids[0]

        async def stall(request, context):
            yield decode_pb2.TokenEvent(token_ids=ids[1:3])
            await asyncio.Event().wait()

        front.cluster.d.script = stall
        reply = await front.http.post("/v1/completions", json={"prompt": "Hi"})
        assert error_of(reply, 504)["code"] == "timeout"
        await eventually(lambda: len(front.cluster.d.aborts) == 1, what="Abort on the decode node")
        await assert_serving(front, tokenizer)
    finally:
        await stop_front(front)

"""Anthropic's ``POST /v1/messages`` on the HTTP front over fake nodes, through the official ``anthropic``
package: the prompt the nodes get is what chat completions sends for the same conversation, the output comes back
as content blocks (whole, and streamed as the package's stream helper accumulates them, each event parsed by
the package's own model of it), stop reasons, usage, ``x-api-key``, and errors in Anthropic's shape before any
node works."""

from __future__ import annotations

import json
import typing

import anthropic
import grpc
import httpx
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pdserve.v1 import decode_pb2

from services.engine.tokenizer import ChatMessage
from services.gateway.generation import GenerateChunk, Usage
from services.gateway.openai.messages_api.render import MessageEvents, MessageRender
from services.gateway.openai.messages_api.to_chat import MessagesBody, chat_body_of
from services.gateway.openai.output_split import OutputSplit
from services.gateway.openai.reasoning.qwen3 import Qwen3ReasoningParser
from services.gateway.openai.tools.hermes import HermesParser
from tests.gateway.fakes import eventually
from tests.gateway.openai.conftest import MODEL, start_front, stop_front
from tests.gateway.openai.test_openai_front_api import script
from tests.gateway.openai.test_openai_front_errors import assert_serving
from tests.gateway.openai.test_openai_front_tools import CALL, HISTORY, TOOLS, prompt_ids, script_tokens

ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                    "input_schema": t["function"].get("parameters", {"type": "object", "properties": {}})}
                   for t in TOOLS]
CONVERSATION = [  # HISTORY's user turn, call and result as Anthropic's blocks
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
]
EVENTS = {model.model_fields["type"].annotation.__args__[0]: model
          for model in typing.get_args(typing.get_args(RawMessageStreamEvent)[0])}


def client_of(front, key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=front.url, api_key=key, max_retries=0, timeout=10)


def events_of(made: MessageRender, pieces: list[str], finish: str = "stop") -> list[dict]:
    events = MessageEvents(made)
    sent = events.opening()
    for i, text in enumerate(pieces):
        last = i == len(pieces) - 1
        sent += events.chunk(GenerateChunk("r", (), text, finish if last else "", Usage(7, 5, 3) if last else None))
    parsed = []
    for data in sent:
        head, body = data.decode().split("\n", 1)
        event = json.loads(body.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        EVENTS[event["type"]].model_validate(event)  # the anthropic package's own event models
        parsed.append(event)
    Message.model_validate(events.message)
    return parsed


@pytest.mark.parametrize("size", [1, 3, 11, 1000])
def test_every_chunking_gives_thinking_text_and_tool_use_blocks(size):
    output = f"<think>\nParis, then.\n</think>\n\nLooking it up.\n{CALL}"
    made = MessageRender("msg_1", MODEL, OutputSplit(Qwen3ReasoningParser(), HermesParser()), 7)
    events = events_of(made, [output[i:i + size] for i in range(0, len(output), size)])
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    assert [e["type"] for e in events][-2:] == ["message_delta", "message_stop"]
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 4, "output_tokens": 5, "cache_read_input_tokens": 3,
                              "cache_creation_input_tokens": 0}
    thinking = "".join(e["delta"].get("thinking", "") for e in events if e["type"] == "content_block_delta")
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    arguments = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    assert (thinking, text.strip(), json.loads(arguments)) == ("\nParis, then.\n", "Looking it up.", {"city": "Paris"})


async def test_a_string_message_is_the_chat_prompt_and_the_package_reads_the_reply(front, tokenizer):
    ids = script(front, tokenizer, cached_tokens=2)
    async with client_of(front) as client:
        reply = await client.messages.create(model=MODEL, max_tokens=32, system="Be brief.",
                                             messages=[{"role": "user", "content": "Hello"}])
    assert prompt_ids(front) == tokenizer.apply_chat_template([ChatMessage("system", "Be brief."),
                                                               ChatMessage("user", "Hello")])
    assert front.cluster.p.requests[-1].sampling.max_tokens == 32
    (block,) = reply.content
    assert (block.type, block.text, reply.stop_reason) == ("text", tokenizer.decode(ids), "max_tokens")
    prompt = len(prompt_ids(front))
    assert (reply.usage.input_tokens, reply.usage.cache_read_input_tokens, reply.usage.output_tokens) == (
        prompt - 2, 2, len(ids))
    assert reply.id.startswith("msg_") and reply.role == "assistant" and reply.model == MODEL


async def test_tool_use_and_tool_result_blocks_are_the_conversation_chat_sends(front, tokenizer):
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=HISTORY[1:], tools=TOOLS)
    chat_prompt = prompt_ids(front)
    script(front, tokenizer)
    async with client_of(front) as client:
        await client.messages.create(model=MODEL, max_tokens=16, messages=CONVERSATION, tools=ANTHROPIC_TOOLS)
    assert prompt_ids(front) == chat_prompt


async def test_count_tokens_is_the_templated_prompt(front, tokenizer):
    script(front, tokenizer)
    async with client_of(front) as client:
        await client.messages.create(model=MODEL, max_tokens=8, messages=CONVERSATION, tools=ANTHROPIC_TOOLS)
        counted = await client.messages.count_tokens(model=MODEL, messages=CONVERSATION, tools=ANTHROPIC_TOOLS)
    assert counted.input_tokens == len(prompt_ids(front))
    assert len(front.cluster.p.requests) == 1  # counting called no node


async def test_a_last_assistant_turn_is_continued_and_block_texts_are_lines(front, tokenizer):
    """Anthropic's prefill: the reply continues a last assistant turn; text blocks join with line breaks, and a
    failed tool's result says so."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "Now."}]},
                {"role": "assistant", "content": "The weather is"}]
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "Weather?\nNow."}, messages[1]],
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    chat_prompt = prompt_ids(front)
    script(front, tokenizer)
    async with client_of(front) as client:
        await client.messages.create(model=MODEL, max_tokens=8, messages=messages)
        assert prompt_ids(front) == chat_prompt

        failed = [*CONVERSATION[:2], {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "no network", "is_error": True}]}]
        script(front, tokenizer)
        await client.messages.create(model=MODEL, max_tokens=8, messages=failed, tools=ANTHROPIC_TOOLS)
    assert tokenizer.decode(prompt_ids(front)).count("Error: no network") == 1


async def test_a_call_is_a_tool_use_block_whole_and_streamed(front, tokenizer):
    async with client_of(front) as client:
        script_tokens(front, tokenizer, f"Let me look.\n{CALL}")
        reply = await client.messages.create(model=MODEL, max_tokens=64, tools=ANTHROPIC_TOOLS,
                                             messages=CONVERSATION[:1])
        script_tokens(front, tokenizer, f"Let me look.\n{CALL}")
        async with client.messages.stream(model=MODEL, max_tokens=64, tools=ANTHROPIC_TOOLS,
                                          messages=CONVERSATION[:1]) as stream:
            final = await stream.get_final_message()
    for made in (reply, final):
        text, call = made.content
        assert (text.type, text.text.strip(), made.stop_reason) == ("text", "Let me look.", "tool_use")
        assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})


async def test_a_stop_sequence_is_named(front, tokenizer):
    script_tokens(front, tokenizer, "Paris is sunny today.")
    async with client_of(front) as client:
        reply = await client.messages.create(model=MODEL, max_tokens=64, stop_sequences=["sunny"],
                                             messages=CONVERSATION[:1])
    assert (reply.content[0].text, reply.stop_reason, reply.stop_sequence) == ("Paris is ", "stop_sequence", "sunny")


async def test_the_anthropic_packages_key_header_is_taken(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, api_key="sk-messages-0123")
    try:
        script(front, tokenizer)
        async with client_of(front, "sk-messages-0123") as client:
            reply = await client.messages.create(model=MODEL, max_tokens=8, messages=CONVERSATION[:1])
        assert reply.content[0].text
        async with client_of(front, "sk-wrong") as client:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await client.messages.create(model=MODEL, max_tokens=8, messages=CONVERSATION[:1])
        assert refused.value.body["error"]["type"] == "authentication_error"  # Anthropic's shape
        async with httpx.AsyncClient(base_url=front.url, timeout=10) as http:  # x-api-key is Anthropic's route's
            assert (await http.get("/v1/models", headers={"x-api-key": "sk-messages-0123"})).status_code == 401
    finally:
        await stop_front(front)


async def test_output_config_format_is_the_output_constraint_and_effort_reaches_the_template(front, tokenizer):
    """Anthropic's structured outputs (``output_config.format``, as ``messages.parse`` sends them) constrain the
    output as chat's ``response_format`` does; ``effort`` is the template's ``reasoning_effort``."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    script_tokens(front, tokenizer, '{"a": 1}')
    async with client_of(front) as client:
        reply = await client.messages.create(model=MODEL, max_tokens=16, messages=CONVERSATION[:1], output_config={
            "format": {"type": "json_schema", "schema": schema}, "effort": "max"})
    structured = front.cluster.p.requests[-1].sampling.structured
    assert structured.WhichOneof("kind") == "json_schema" and json.loads(structured.json_schema) == schema
    assert json.loads(reply.content[0].text) == {"a": 1}

    class Answer(pydantic.BaseModel):
        a: int

    script_tokens(front, tokenizer, '{"a": 7}')
    async with client_of(front) as client:  # the package's own helper: a type in, a parsed object out
        parsed = await client.messages.parse(model=MODEL, max_tokens=16, messages=CONVERSATION[:1],
                                             output_format=Answer)
    assert parsed.parsed_output == Answer(a=7)
    assert json.loads(front.cluster.p.requests[-1].sampling.structured.json_schema)["required"] == ["a"]
    for effort, chat in (("low", "low"), ("high", "high"), ("xhigh", "high"), ("max", "high")):
        body = MessagesBody(max_tokens=8, messages=CONVERSATION[:1], output_config={"effort": effort})
        assert chat_body_of(body).reasoning_effort == chat


BAD = [  # (body, status, the message's start)
    ({"messages": CONVERSATION[:1]}, 400, "max_tokens:"),
    ({"max_tokens": 0, "messages": CONVERSATION[:1]}, 400, "max_tokens:"),
    ({"max_tokens": 8, "messages": []}, 400, "messages:"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, 400, "messages[0].role:"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "messages[0].content[0].type:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "tools": [{"type": "web_search_20250305", "name": "w"}]},
     400, "tools[0].type:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "tools": [{"name": "a b", "input_schema": {}}]}, 400,
     "tools[0].name:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "tools": ANTHROPIC_TOOLS,
      "tool_choice": {"type": "tool", "name": "nope"}}, 400, "tool_choice:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "n": 2}, 400, "n:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "thinking": {"type": "sometimes"}}, 400, "thinking.type:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "model": "claude-opus"}, 404, "The model"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "output_config": {"format": {"type": "regex"}}}, 400,
     "output_config.format.type:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "output_config": {"format": {"type": "json_schema"}}}, 400,
     "output_config.format.schema:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "output_config": {"effort": "extreme"}}, 400,
     "output_config.effort:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "output_config": {"task_budget": 5}}, 400,
     "output_config.task_budget:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}}, 400,
     "output_config.format:"),
    ({"max_tokens": 8, "messages": CONVERSATION[:1], "response_format": {"type": "json_object"}}, 400,
     "response_format:"),
]


async def test_bad_bodies_get_anthropics_error_shape_and_call_no_node(front, tokenizer):
    async with httpx.AsyncClient(base_url=front.url, timeout=10) as http:
        for body, status, start in BAD:
            for stream in (False, True):
                reply = await http.post("/v1/messages", json={**body, "stream": stream})
                assert reply.status_code == status, (body, reply.text)
                error = reply.json()
                assert error["type"] == "error" and set(error["error"]) == {"type", "message"}, error
                assert error["error"]["message"].startswith(start), (body, error)
                kind = "invalid_request_error" if status == 400 else "not_found_error"
                assert error["error"]["type"] == kind
        malformed = await http.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
        assert malformed.status_code == 400 and malformed.json()["error"]["message"].startswith("malformed JSON")
        deep = await http.post("/v1/messages", content=b"[" * 100_000, headers={"content-type": "application/json"})
        assert deep.status_code == 400 and deep.json()["error"]["type"] == "invalid_request_error"
        huge = await http.post("/v1/messages", json={"max_tokens": 8, "messages": [
            {"role": "user", "content": "x" * (2 << 20)}]})  # past the front's 1 MiB
        assert huge.status_code == 413 and huge.json()["error"]["type"] == "request_too_large"
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)


@pytest.mark.parametrize(("path", "body", "last", "kind"), [
    ("/v1/messages", {"max_tokens": 16, "messages": CONVERSATION[:1]}, "error", "overloaded_error"),
    ("/v1/responses", {"input": "Hi"}, "response.failed", "server_error"),
])
async def test_a_decode_node_failing_mid_stream_ends_the_stream_with_its_error_event(front, tokenizer, path, body,
                                                                                   last, kind):
    ids = tokenizer.encode("Paris is sunny today.")
    front.cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        await context.abort(grpc.StatusCode.INTERNAL, "decode step crashed")

    front.cluster.d.script = attach
    async with httpx.AsyncClient(base_url=front.url, timeout=10) as http:
        reply = await http.post(path, json={**body, "stream": True})
        assert reply.status_code == 200
        events = [json.loads(block.split("\ndata: ", 1)[1]) for block in reply.text.strip().split("\n\n")]
        assert events[-1]["type"] == last, events[-1]
        error = events[-1]["error"] if last == "error" else events[-1]["response"]["error"]
        assert "decode step crashed" in error["message"]
        assert error.get("type", error.get("code")) == kind  # the 503 the failure would have been
        text = "".join(e["delta"].get("text", "") if isinstance(e.get("delta"), dict) else e.get("delta", "")
                       for e in events if e["type"] in ("content_block_delta", "response.output_text.delta"))
        assert text == tokenizer.decode(ids[:3])
    await eventually(lambda: front.cluster.gateway.directory.nodes("decode")[0].healthy, what="decode back")
    await assert_serving(front, tokenizer)

"""``POST /v1/responses`` on the HTTP front over fake nodes, through the official ``openai`` package: the
prompt the nodes get is what chat completions sends for the same conversation, the output comes back as
Responses items (whole, and streamed as the package's own stream helper accumulates it), tool calls, forced
calls and ``text.format`` reach the nodes as chat's do, and bad bodies are a 400 naming the Responses param
before any node works."""

from __future__ import annotations

import json

import pytest

from services.engine.tokenizer import ChatMessage
from services.gateway.openai.responses_api.body import ResponsesBody
from services.gateway.openai.responses_api.to_chat import chat_body_of
from services.gateway.openai.tools.hermes import HermesParser
from services.gateway.openai.tools.types import ParsedToolCall
from tests.gateway.openai.conftest import MODEL
from tests.gateway.openai.test_openai_front_api import script
from tests.gateway.openai.test_openai_front_errors import assert_serving, error_of
from tests.gateway.openai.test_openai_front_tools import CALL, HISTORY, SPECS, TOOLS, prompt_ids, script_tokens

FUNCTIONS = [{"type": "function", **tool["function"]} for tool in TOOLS]  # Responses' flat function tools
ITEMS = [  # HISTORY (system, user, assistant's call, tool result) as Responses input items
    {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look."}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
]


async def test_a_string_input_is_the_chat_prompt_and_the_package_reads_the_output(front, tokenizer):
    ids = script(front, tokenizer)
    response = await front.client.responses.create(model=MODEL, input="Hello", max_output_tokens=32)
    assert prompt_ids(front) == tokenizer.apply_chat_template([ChatMessage("user", "Hello")])
    assert front.cluster.p.requests[-1].sampling.max_tokens == 32
    assert response.output_text == tokenizer.decode(ids) and response.id.startswith("resp_")
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert (response.usage.output_tokens, response.store, response.max_output_tokens) == (len(ids), False, 32)

    reply = await front.http.post("/v1/responses", json={"input": "Hello", "instructions": "Be brief."},
                                  headers={"X-Request-Id": "abc"})
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "abc"
    assert reply.json()["id"] == "resp_abc" and reply.json()["instructions"] == "Be brief."
    assert prompt_ids(front) == tokenizer.apply_chat_template([ChatMessage("system", "Be brief."),
                                                               ChatMessage("user", "Hello")])


async def test_items_are_the_conversation_chat_completions_sends(front, tokenizer):
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=[
        *HISTORY[:2], {**HISTORY[2], "reasoning_content": "Look."}, HISTORY[3]], tools=TOOLS)
    chat_prompt = prompt_ids(front)
    script(front, tokenizer)
    await front.client.responses.create(model=MODEL, instructions="Be brief.", input=ITEMS, tools=FUNCTIONS)
    assert prompt_ids(front) == chat_prompt

    script(front, tokenizer)  # a message of the assistant before its call: one assistant turn
    text = {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]}
    await front.client.responses.create(model=MODEL, input=[ITEMS[0], text, *ITEMS[2:]], tools=FUNCTIONS)
    calls = HermesParser().render_calls([ParsedToolCall("get_weather", '{"city": "Paris"}')])
    assert prompt_ids(front) == tokenizer.apply_chat_template([
        ChatMessage("system", HermesParser().tools_prompt(SPECS)), ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", f"Let me look.\n{calls}"),
        ChatMessage("user", HermesParser().render_result("sunny", "get_weather"))])


async def test_a_call_is_a_function_call_item_whole_and_streamed(front, tokenizer):
    script_tokens(front, tokenizer, f"Let me look.\n{CALL}")
    response = await front.client.responses.create(model=MODEL, input="Weather in Paris?", tools=FUNCTIONS)
    message, call = response.output
    assert (message.type, message.content[0].text, response.status) == ("message", "Let me look.", "completed")
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", {"city": "Paris"})
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")

    script_tokens(front, tokenizer, f"Let me look.\n{CALL}")
    async with front.client.responses.stream(model=MODEL, input="Weather in Paris?", tools=FUNCTIONS) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output_text.strip() == "Let me look." and final.output[1].arguments == call.arguments


@pytest.mark.parametrize(("choice", "tools"), [("required", SPECS), ({"type": "function", "name": "get_time"},
                                                                     SPECS[1:])])
async def test_a_forced_choice_sends_the_parsers_grammar(front, tokenizer, choice, tools):
    script_tokens(front, tokenizer, CALL)
    await front.client.responses.create(model=MODEL, input="Weather?", tools=FUNCTIONS, tool_choice=choice,
                                        parallel_tool_calls=False)
    structured = front.cluster.p.requests[0].sampling.structured
    assert structured.grammar == HermesParser().forced_grammar(tools, False)


async def test_text_format_is_the_output_constraint(front, tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    script_tokens(front, tokenizer, '{"a": 1}')
    response = await front.client.responses.create(model=MODEL, input="Give a.", text={"format": {
        "type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    structured = front.cluster.p.requests[0].sampling.structured
    assert structured.WhichOneof("kind") == "json_schema" and json.loads(structured.json_schema)["required"] == ["a"]
    assert json.loads(response.output_text) == {"a": 1} and response.text.format.type == "json_schema"


async def test_logprobs_of_the_output_text(front, tokenizer):
    ids = script_tokens(front, tokenizer, "Paris is sunny.")
    reply = await front.http.post("/v1/responses", json={"input": "Weather?", "top_logprobs": 2,
                                                         "include": ["message.output_text.logprobs"]})
    part = reply.json()["output"][0]["content"][0]
    assert [lp["token"] for lp in part["logprobs"]] == [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert front.cluster.p.requests[0].sampling.logprobs == 2


def test_reasoning_items_go_to_the_assistant_turn_right_after_them():
    body = ResponsesBody(input=[
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "cut off"}]},
        {"role": "user", "content": "Again?"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "One."}]},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Two."}]},
        ITEMS[2], {**ITEMS[2], "call_id": "call_2"}, ITEMS[3]])
    translated = chat_body_of(body)
    assert [(m.role, m.reasoning_content, len(m.tool_calls or ())) for m in translated.body.messages] == [
        ("user", None, 0), ("assistant", "One.\nTwo.", 2), ("tool", None, 0)]
    assert translated.origins == {"messages[0]": "input[1]", "messages[1]": "input[4]",
                                  "messages[1].tool_calls[0]": "input[4]", "messages[1].tool_calls[1]": "input[5]",
                                  "messages[2]": "input[6]"}


BAD = [  # (body, param)
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": [ITEMS[0], ITEMS[2], {**ITEMS[2], "arguments": "{"}]}, "input[2].arguments"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, "input[0].output"),
    ({"previous_response_id": "resp-1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name"),
    ({"tools": FUNCTIONS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": FUNCTIONS, "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"tools": FUNCTIONS, "tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"max_tokens": 5}, "max_tokens"),
    ({"n": 2}, "n"),
    ({"messages": [{"role": "user", "content": "x"}]}, "messages"),
    ({"include": ["message.output_text.logprob"]}, "include"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"tools": FUNCTIONS, "include": ["message.output_text.logprobs"]}, "include"),
    ({"temperature": -1}, "temperature"),
    ({"echo": True}, "echo"),
]


async def test_bad_bodies_are_400_naming_the_param_and_call_no_node(front, tokenizer):
    for body, param in BAD:
        for stream in (False, True):
            reply = await front.http.post("/v1/responses", json={"input": "Hi", "stream": stream, **body})
            error = error_of(reply, 400)
            assert (error["type"], error["param"]) == ("invalid_request_error", param), (body, error)
            assert error["message"].startswith(f"{param}:"), (body, error)
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)

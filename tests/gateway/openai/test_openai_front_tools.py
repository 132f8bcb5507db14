"""Tool calling through the HTTP front over fake nodes: bad tools, tool choices and tool messages are a 400
naming the param before any node works; the prompt the nodes get (the bundled SmolLM2 template has no tool
section: the parser's system block and text; a template with one: the tools given to it); the grammar a
forced choice sends; the ``openai`` package reading whole and streamed calls."""

from __future__ import annotations

import json

import pytest
from pdserve.v1 import decode_pb2, gateway_pb2

from services.engine.tokenizer import ChatMessage, Tokenizer, ToolCallRecord
from services.gateway.openai.tools.hermes import HermesParser
from services.gateway.openai.tools.types import ParsedToolCall, ToolSpec
from tests.gateway.openai.conftest import MODEL, start_front, stop_front
from tests.gateway.openai.test_openai_front_api import script
from tests.gateway.openai.test_openai_front_errors import assert_serving, error_of

CHAT = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]
SPECS = [ToolSpec("get_weather", "The weather of a city", WEATHER), ToolSpec("get_time")]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def script_tokens(front, tokenizer, text: str, finish: str = "stop") -> list[int]:
    """P answers the first token of ``text``; D the rest one token per event, the last ending on ``finish``
    (each with its logprob: -1)."""
    ids = tokenizer.encode(text)
    front.cluster.p.first_token, front.cluster.p.first_logprob = ids[0], logprob(ids[0])

    async def attach(request, context):
        for token in ids[1:-1]:
            yield decode_pb2.TokenEvent(token_ids=[token], logprobs=[logprob(token)])
        yield decode_pb2.TokenEvent(token_ids=ids[-1:], finish_reason=finish, logprobs=[logprob(ids[-1])],
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)))

    front.cluster.d.script = attach
    return ids


def logprob(token_id: int) -> gateway_pb2.TokenLogprob:
    return gateway_pb2.TokenLogprob(token_id=token_id, logprob=-1.0, top=[])


def prompt_ids(front) -> list[int]:
    return list(front.cluster.p.requests[-1].prompt_token_ids)


BAD = [  # (body, param)
    ({"tools": [TOOLS[0], {"type": "function", "function": {"description": "x"}}]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "sometimes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
      "guided_regex": "a+"}, "guided_regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}], "tool_choice": "required"}, "tools"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": HISTORY[2]["tool_calls"]}]},
     "messages[0].tool_calls"),
    ({"messages": [*HISTORY[:3], {"role": "tool", "content": "sunny"}]}, "messages[3].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].id"),
]


async def test_bad_tools_are_400_naming_the_param_and_call_no_node(front, tokenizer):
    for body, param in BAD:
        for stream in (False, True):
            reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT, "stream": stream,
                                                                        **body})
            error = error_of(reply, 400)
            assert (error["type"], error["param"]) == ("invalid_request_error", param), (body, error)
            assert error["message"].startswith(f"{param}:"), (body, error)
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)


async def test_a_forced_choice_with_a_constraint_names_both(front):
    reply = await front.http.post("/v1/chat/completions", json={
        "messages": CHAT, "tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}})
    message = error_of(reply, 400)["message"]
    assert "tool_choice" in message and "response_format" in message


async def test_tools_on_completions_are_refused(front):
    reply = await front.http.post("/v1/completions", json={"prompt": "Hi", "tools": TOOLS})
    assert error_of(reply, 400)["param"] == "tools"
    assert front.cluster.p.requests == []


async def test_without_a_tool_section_the_tools_are_a_system_block(front, tokenizer):
    """SmolLM2's template has no tools: the parser's block goes first in the system message (a new one
    when there is none), earlier calls are written as the model writes them, a result as a user turn."""
    assert not tokenizer.template_takes_tools
    parser = HermesParser()
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    assert prompt_ids(front) == tokenizer.apply_chat_template(
        [ChatMessage("system", parser.tools_prompt(SPECS)), ChatMessage("user", CHAT[0]["content"])])

    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=HISTORY, tools=TOOLS)
    calls = parser.render_calls([ParsedToolCall("get_weather", '{"city": "Paris"}')])
    assert prompt_ids(front) == tokenizer.apply_chat_template([
        ChatMessage("system", f"{parser.tools_prompt(SPECS)}\n\nBe brief."), ChatMessage("user", HISTORY[1]["content"]),
        ChatMessage("assistant", calls), ChatMessage("user", parser.render_result("sunny", "get_weather"))])


async def test_tool_choice_none_offers_nothing_and_parses_nothing(front, tokenizer):
    script_tokens(front, tokenizer, CALL)
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS,
                                                            tool_choice="none")
    assert prompt_ids(front) == tokenizer.apply_chat_template([ChatMessage("user", CHAT[0]["content"])])
    message = completion.choices[0].message
    assert message.content == CALL and not message.tool_calls
    assert completion.choices[0].finish_reason == "stop"


TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }}={{ t.function.parameters "
    "| tojson }};{% endfor %}<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}{% for c in message.tool_calls or [] %}CALL {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
async def tool_template_front(model_config):
    from services.engine.model_files import bundled_model_path

    tokenizer = Tokenizer.load(bundled_model_path(), model_config.eos_token_ids)
    tokenizer.hf.chat_template = TOOL_TEMPLATE
    assert tokenizer.template_takes_tools
    running = await start_front(tokenizer, model_config)
    try:
        yield running, tokenizer
    finally:
        await stop_front(running)


async def test_a_template_with_a_tool_section_gets_the_tools_and_the_turns(tool_template_front):
    front, tokenizer = tool_template_front
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=HISTORY, tools=TOOLS)
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", HISTORY[1]["content"]),
                ChatMessage("assistant", "", (ToolCallRecord("call_1", "get_weather", '{"city": "Paris"}'),)),
                ChatMessage("tool", "sunny", tool_call_id="call_1")]
    expected = tokenizer.apply_chat_template(messages, tools=[s.openai_dict() for s in SPECS])
    assert prompt_ids(front) == expected
    assert "TOOLS:get_weather=" in tokenizer.decode(expected)

    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=HISTORY, tools=TOOLS, tool_choice="none")
    assert prompt_ids(front) == tokenizer.apply_chat_template(messages)


@pytest.mark.parametrize(("choice", "parallel", "tools", "grammar_parallel"), [
    ("required", True, SPECS, True),
    ("required", False, SPECS, False),
    ({"type": "function", "function": {"name": "get_time"}}, True, SPECS[1:], False),
])
async def test_a_forced_choice_sends_the_parsers_grammar(front, tokenizer, choice, parallel, tools,
                                                         grammar_parallel):
    script_tokens(front, tokenizer, CALL)
    await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice=choice,
                                               parallel_tool_calls=parallel)
    structured = front.cluster.p.requests[0].sampling.structured
    assert structured.WhichOneof("kind") == "grammar"
    assert structured.grammar == HermesParser().forced_grammar(tools, grammar_parallel)
    assert not structured.HasField("starts_after_token_id")  # no reasoning parser


async def test_auto_takes_a_response_format_and_sends_no_grammar(front, tokenizer):
    script_tokens(front, tokenizer, '{"a": 1}')
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS,
                                                            response_format={"type": "json_object"})
    assert front.cluster.p.requests[0].sampling.structured.WhichOneof("kind") == "json_object"
    assert completion.choices[0].message.content == '{"a": 1}'


async def test_the_openai_package_reads_a_whole_call(front, tokenizer):
    script_tokens(front, tokenizer, f"Let me look.\n{CALL}")
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

    script_tokens(front, tokenizer, CALL)
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    assert completion.choices[0].message.content is None and len(completion.choices[0].message.tool_calls) == 1


async def test_the_openai_package_reads_a_streamed_call(front, tokenizer):
    script_tokens(front, tokenizer, f"Let me look.\n{CALL}\n{CALL.replace('Paris', 'Rome')}")
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, stream=True)
    chunks = [chunk async for chunk in stream]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    deltas = [call for c in chunks for call in c.choices[0].delta.tool_calls or ()]
    assert content.strip() == "Let me look." and "<tool_call>" not in content
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (0, "get_weather", {"city": "Paris"}), (1, "get_weather", {"city": "Rome"})]
    assert all(d.id.startswith("call_") and d.type == "function" for d in deltas)
    assert len({d.id for d in deltas}) == 2
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]


async def test_a_call_cut_by_the_length_is_content(front, tokenizer):
    script_tokens(front, tokenizer, CALL[:30], finish="length")
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == CALL[:30] and not completion.choices[0].message.tool_calls


async def test_n_choices_with_logprobs_each_get_their_calls(front, tokenizer):
    ids = script_tokens(front, tokenizer, CALL)
    for stream in (False, True):
        reply = await front.http.post("/v1/chat/completions", json={
            "messages": CHAT, "tools": TOOLS, "n": 2, "logprobs": True, "stream": stream})
        assert reply.status_code == 200, reply.text
        if not stream:
            choices = reply.json()["choices"]
            assert [c["finish_reason"] for c in choices] == ["tool_calls"] * 2
            assert all(len(c["message"]["tool_calls"]) == 1 for c in choices)
            assert all(len(c["logprobs"]["content"]) == len(ids) for c in choices)
            continue
        events = [json.loads(line[6:]) for line in reply.text.split("\n\n") if line.startswith("data: {")]
        for index in (0, 1):
            mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
            calls = [call for c in mine for call in c["delta"].get("tool_calls", ())]
            assert [call["index"] for call in calls] == [0] and calls[0]["function"]["name"] == "get_weather"
            assert sum(len(c["logprobs"]["content"]) for c in mine if c.get("logprobs")) == len(ids)
            assert mine[-1]["finish_reason"] == "tool_calls"

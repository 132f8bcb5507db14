"""GPT-OSS's harmony output through the HTTP front over fake nodes, with ``--reasoning-parser gpt_oss`` and
``--tool-call-parser gpt_oss`` and a tokenizer that has harmony's markers as special tokens (kept in the
decoded output for the parsers): the analysis as ``reasoning_content``, the final channel as ``content``, a
message to ``functions.NAME`` as a tool call, whole and streamed through the ``openai`` package; a constraint
sent to the nodes starts after the three tokens of ``<|channel|>final<|message|>``; a forced call is a 400."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.gateway.openai.conftest import MODEL, start_front, stop_front
from tests.gateway.openai.test_harmony_parsers import THINK, harmony_tokenizer
from tests.gateway.openai.test_openai_front_tools import CHAT, TOOLS, script_tokens

ANSWER = f"{THINK}<|start|>assistant<|channel|>final<|message|>It is sunny."
CALL = (f"{THINK}<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}')


@pytest.fixture(scope="module")
def harmony(bundled_tokenizer):
    return harmony_tokenizer(bundled_tokenizer.hf)


@pytest.fixture
async def front(harmony, model_config):
    config = dataclasses.replace(model_config, vocab_size=len(harmony.hf))
    running = await start_front(harmony, config, reasoning_parser="gpt_oss", tool_call_parser="gpt_oss")
    try:
        yield running
    finally:
        await stop_front(running)


async def test_the_analysis_is_the_reasoning_and_the_final_channel_the_content(front, harmony):
    script_tokens(front, harmony, ANSWER)
    message = (await front.client.chat.completions.create(model=MODEL, messages=CHAT)).choices[0].message
    assert (message.reasoning_content, message.content) == ("The user wants Paris.", "It is sunny.")
    script_tokens(front, harmony, ANSWER)
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == \
        "The user wants Paris."
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "It is sunny."


async def test_a_message_to_a_function_is_a_tool_call_whole_and_streamed(front, harmony):
    script_tokens(front, harmony, CALL)
    choice = (await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    script_tokens(front, harmony, CALL)
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, stream=True)
    chunks = [chunk async for chunk in stream]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [("get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<|" not in "".join(c.choices[0].delta.content or "" for c in chunks)


async def test_a_constraint_starts_after_the_final_channels_header(front, harmony):
    script_tokens(front, harmony, ANSWER)
    reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT,
                                                                 "response_format": {"type": "json_object"}})
    assert reply.status_code == 200, reply.text
    structured = front.cluster.p.requests[-1].sampling.structured
    header = [harmony.hf.convert_tokens_to_ids(t) for t in ("<|channel|>", "<|message|>")]
    final = harmony.hf.encode("final", add_special_tokens=False)
    assert list(structured.starts_after_token_ids) == [header[0], *final, header[1]]
    assert not structured.HasField("starts_after_token_id")  # no single token for an earlier node to read


async def test_a_forced_call_is_refused_naming_tool_choice(front):
    reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS,
                                                                 "tool_choice": "required"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "tool_choice" and "cannot force a call" in error["message"]
    assert not front.cluster.p.requests  # no node worked

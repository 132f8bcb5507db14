"""Gemma 4's output through the HTTP front over fake nodes, with ``--reasoning-parser gemma4`` and
``--tool-call-parser gemma4`` and a tokenizer that has Gemma 4's markers as special tokens (kept in the decoded
output for the parsers): the thought channel as ``reasoning_content`` (its label dropped), calls written back to back
as ``tool_calls`` with JSON arguments, whole and streamed through the ``openai`` package; a forced call's grammar
sent to the nodes starts after ``<channel|>``."""

from __future__ import annotations

import dataclasses
import json
import tempfile

import pytest
from transformers import AutoTokenizer

from services.engine.tokenizer import Tokenizer
from tests.gateway.openai.conftest import MODEL, start_front, stop_front
from tests.gateway.openai.test_openai_front_tools import CHAT, TOOLS, script_tokens

MARKERS = ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>")
Q = '<|"|>'
CALLS = (f"<|channel>thought\nThe user wants Paris.<channel|><|tool_call>call:get_weather{{city:{Q}Paris, FR{Q}}}"
         "<tool_call|><|tool_call>call:get_time{}<tool_call|>")


@pytest.fixture(scope="module")
def gemma4(bundled_tokenizer) -> Tokenizer:
    """The bundled tokenizer with Gemma 4's markers as special tokens (as Gemma 4's tokenizer has them)."""
    with tempfile.TemporaryDirectory() as staging:
        bundled_tokenizer.hf.save_pretrained(staging)
        hf = AutoTokenizer.from_pretrained(staging)
        hf.add_special_tokens({"additional_special_tokens": list(MARKERS)})
        hf.save_pretrained(staging)
        return Tokenizer.load(staging)


@pytest.fixture
async def front(gemma4, model_config):
    config = dataclasses.replace(model_config, vocab_size=len(gemma4.hf))
    running = await start_front(gemma4, config, reasoning_parser="gemma4", tool_call_parser="gemma4")
    try:
        yield running
    finally:
        await stop_front(running)


async def test_the_thought_is_the_reasoning_and_the_calls_are_tool_calls_whole_and_streamed(front, gemma4):
    want = [("get_weather", {"city": "Paris, FR"}), ("get_time", {})]
    script_tokens(front, gemma4, CALLS)
    choice = (await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert choice.message.reasoning_content == "The user wants Paris."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == want
    script_tokens(front, gemma4, CALLS)
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, stream=True)
    chunks = [chunk async for chunk in stream]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == want
    assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == \
        "The user wants Paris."
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<|" not in "".join(c.choices[0].delta.content or "" for c in chunks)


async def test_a_forced_call_is_gemma4_s_grammar_after_the_thought(front, gemma4):
    script_tokens(front, gemma4, CALLS.split("<|tool_call>call:get_time")[0])
    reply = await front.http.post("/v1/chat/completions", json={
        "messages": CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert reply.status_code == 200, reply.text
    structured = front.cluster.p.requests[-1].sampling.structured
    opening = f'<[{gemma4.hf.convert_tokens_to_ids("<|tool_call>")}]> "call:"'  # the marker as its special token
    assert opening in structured.grammar and '"get_weather"' in structured.grammar
    assert '"get_time"' not in structured.grammar  # a named function: its alternative only
    assert list(structured.starts_after_token_ids) == [gemma4.hf.convert_tokens_to_ids("<channel|>")]
    (call,) = reply.json()["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather",
                                                                                     {"city": "Paris, FR"})

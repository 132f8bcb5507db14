"""Reasoning content and tool calls split out of a choice's output: the chat renderer fed GenerateChunks
directly (whole, and streamed in every chunking), and the HTTP front over fake nodes with
``--reasoning-parser`` (every constraint it builds starts after the end of the thinking; a marker that is
not one token stops the gateway at startup, naming the flag)."""

from __future__ import annotations

import json

import pytest

from services.gateway.config import GatewayConfig
from services.gateway.generation import GenerateChunk, Usage
from services.gateway.main import assemble
from services.gateway.openai import parsers
from services.gateway.openai.output_split import OutputSplit
from services.gateway.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from services.gateway.openai.reasoning.qwen3 import Qwen3ReasoningParser
from services.gateway.openai.tools.hermes import HermesParser
from services.gateway.openai.translate import ChatRenderer, Identity
from tests.gateway.openai.conftest import MODEL, start_front, stop_front
from tests.gateway.openai.test_openai_front_tools import CALL, CHAT, TOOLS, script_tokens

USAGE = Usage(3, 5, 0)
THOUGHT = "<think>\nThe user wants Paris.\n</think>\n\n"
OUTPUT = f"{THOUGHT}Looking it up.\n{CALL}"
END_ID = 17  # stands for the end marker's token id (SmolLM2 has no single </think> token)


def renderer(reasoning=True, tools=True) -> ChatRenderer:
    split = OutputSplit(Qwen3ReasoningParser() if reasoning else None, HermesParser() if tools else None)
    return ChatRenderer(Identity("chatcmpl-1", MODEL, 0), split=split)


def streamed(render: ChatRenderer, pieces: list[str], finish: str = "stop") -> list[dict]:
    """The choices of the chunks ``render`` sends for ``pieces`` (the last with ``finish``)."""
    out = []
    for i, text in enumerate(pieces):
        last = i == len(pieces) - 1
        body = render.chunk(GenerateChunk("r", (), text, finish if last else "", USAGE if last else None), i == 0)
        if body is not None:
            out.append(body.model_dump()["choices"][0])
    return out


def joined(choices: list[dict], key: str) -> str:
    return "".join(c["delta"].get(key) or "" for c in choices)


def test_whole_output_splits_into_reasoning_content_and_calls():
    message = renderer().whole(OUTPUT, "stop", USAGE).model_dump()["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    body = message["message"]
    assert body["reasoning_content"] == "\nThe user wants Paris.\n" and body["content"] == "Looking it up."
    (call,) = body["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_whole_output_without_parsers_is_unchanged():
    body = renderer(reasoning=False, tools=False).whole(OUTPUT, "stop", USAGE).model_dump()["choices"][0]
    assert body["finish_reason"] == "stop"
    assert body["message"] == {"role": "assistant", "content": OUTPUT}  # no reasoning_content, no tool_calls


def test_reasoning_without_tools_keeps_the_call_text_and_says_none_when_no_thinking():
    body = renderer(tools=False).whole(OUTPUT, "stop", USAGE).model_dump()["choices"][0]
    assert body["finish_reason"] == "stop" and body["message"]["content"].endswith(CALL)
    plain = renderer(tools=False).whole("Hi.", "length", USAGE).model_dump()["choices"][0]["message"]
    assert plain == {"role": "assistant", "content": "Hi.", "reasoning_content": None}


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_every_chunking_streams_what_the_whole_says(size):
    whole = renderer().whole(OUTPUT, "stop", USAGE).model_dump()["choices"][0]["message"]
    choices = streamed(renderer(), [OUTPUT[i:i + size] for i in range(0, len(OUTPUT), size)])
    assert choices[0]["delta"]["role"] == "assistant"
    assert joined(choices, "reasoning_content") == whole["reasoning_content"]
    assert joined(choices, "content").strip() == whole["content"]
    calls = [call for c in choices for call in c["delta"].get("tool_calls") or ()]
    assert [(c["index"], c["function"]) for c in calls] == [(0, whole["tool_calls"][0]["function"])]
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["tool_calls"]
    assert all("<think>" not in joined(choices, key) and "</think>" not in joined(choices, key)
               for key in ("content", "reasoning_content"))


def test_held_back_text_comes_out_at_the_finish():
    """A stream cut inside a call block: the block was held back, and is content in the finish chunk."""
    cut = CALL[:25]
    choices = streamed(renderer(reasoning=False), ["Hmm ", cut[:10], cut[10:]], finish="length")
    assert "<tool_call" not in "".join(joined(choices[:-1], "content"))
    assert joined(choices, "content") == f"Hmm {cut}"
    assert choices[-1]["finish_reason"] == "length" and "tool_calls" not in choices[-1]["delta"]


def test_deepseek_r1_reasoning_has_no_opening_marker():
    split = OutputSplit(DeepSeekR1ReasoningParser(), None)
    render = ChatRenderer(Identity("chatcmpl-1", MODEL, 0), split=split)
    choices = streamed(render, ["thinking", " more</th", "ink>\n\nAnswer."])
    assert (joined(choices, "reasoning_content"), joined(choices, "content")) == ("thinking more", "Answer.")


@pytest.fixture
async def reasoning_front(tokenizer, model_config, monkeypatch):
    """The front with --reasoning-parser qwen3; the end marker stands as token END_ID."""
    monkeypatch.setattr(parsers, "end_token_ids", lambda parser, tokenizer: (END_ID,))
    running = await start_front(tokenizer, model_config, reasoning_parser="qwen3")
    try:
        yield running
    finally:
        await stop_front(running)


@pytest.mark.parametrize(("path", "extra", "kind"), [
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "json_object"),
    ("/v1/chat/completions", {"guided_choice": ["a", "b"]}, "choice"),
    ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": "required"}, "grammar"),
    ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "grammar"),
    ("/v1/completions", {"guided_regex": "[a-z]+"}, "regex"),
])
async def test_every_constraint_starts_after_the_reasoning(reasoning_front, tokenizer, path, extra, kind):
    front = reasoning_front
    script_tokens(front, tokenizer, "a")
    body = {"messages": CHAT} if path.endswith("chat/completions") else {"prompt": "Hi"}
    reply = await front.http.post(path, json={**body, **extra})
    assert reply.status_code == 200, reply.text
    structured = front.cluster.p.requests[0].sampling.structured
    assert structured.WhichOneof("kind") == kind and list(structured.starts_after_token_ids) == [END_ID]
    assert structured.starts_after_token_id == END_ID  # one token: for nodes of an earlier version too


async def test_no_constraint_stays_none_with_a_reasoning_parser(reasoning_front, tokenizer):
    script_tokens(reasoning_front, tokenizer, "a")
    await reasoning_front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    assert not reasoning_front.cluster.p.requests[0].sampling.HasField("structured")


async def test_the_openai_package_reads_reasoning_content(reasoning_front, tokenizer):
    front = reasoning_front
    script_tokens(front, tokenizer, OUTPUT)
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    message = completion.choices[0].message
    assert message.model_extra["reasoning_content"] == "\nThe user wants Paris.\n"
    assert message.content == "Looking it up." and message.tool_calls[0].function.name == "get_weather"

    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, stream=True)
    chunks = [chunk.choices[0] async for chunk in stream]
    assert "".join(c.delta.model_extra.get("reasoning_content") or "" for c in chunks) == "\nThe user wants Paris.\n"
    assert "".join(c.delta.content or "" for c in chunks).strip() == "Looking it up."
    assert [d.function.name for c in chunks for d in c.delta.tool_calls or ()] == ["get_weather"]
    assert chunks[-1].finish_reason == "tool_calls"


async def test_a_marker_that_is_not_one_token_stops_the_gateway_at_startup(tokenizer, model_config):
    config = GatewayConfig(listen="127.0.0.1:0", prefill="127.0.0.1:1", decode="127.0.0.1:2",
                           http_listen="127.0.0.1:0", reasoning_parser="qwen3", log_level="warning")
    with pytest.raises(ValueError, match="--reasoning-parser qwen3"):
        assemble(config, tokenizer, vocab_size=model_config.vocab_size, max_position=model_config.max_position)

"""GPT-OSS's harmony output read by ``--reasoning-parser gpt_oss`` and ``--tool-call-parser gpt_oss``: what each
makes of a whole output (the analysis channel as reasoning, the final channel and preambles as content, a
message to ``functions.NAME`` as a call), alone and chained as the front chains them; that a stream gives the
same for any chunking; the markers' tokens a constraint starts after; the registries' names and aliases."""

from __future__ import annotations

import json
import random
import tempfile

import pytest
from transformers import AutoTokenizer

from services.engine.tokenizer import Tokenizer
from services.gateway.openai.harmony import MARKERS, HarmonyReader
from services.gateway.openai.output_split import OutputSplit, SplitOutput
from services.gateway.openai.reasoning.gpt_oss import GptOssReasoningParser
from services.gateway.openai.reasoning.registry import end_token_ids, reasoning_parser
from services.gateway.openai.tools.gpt_oss import GptOssToolParser
from services.gateway.openai.tools.registry import detect_family, tool_call_parser
from services.gateway.openai.tools.types import ParsedToolCall

REASONING, TOOLS = GptOssReasoningParser(), GptOssToolParser()
THINK = "<|channel|>analysis<|message|>The user wants Paris.<|end|>"
NEXT = "<|start|>assistant"
WEATHER = ParsedToolCall("get_weather", json.dumps({"city": "Paris"}))

# (output, reasoning, content, calls) as the front splits it with both parsers
CASES = [
    ("", "", "", ()),
    ("It is sunny.", "", "It is sunny.", ()),  # not harmony at all: content
    (f"{THINK}{NEXT}<|channel|>final<|message|>It is sunny.", "The user wants Paris.", "It is sunny.", ()),
    (f"{THINK}{NEXT}<|channel|>final<|message|>It is sunny.<|return|>", "The user wants Paris.", "It is sunny.", ()),
    (f'{THINK}{NEXT}<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{"city": "Paris"}}',
     "The user wants Paris.", "", (WEATHER,)),
    (f'{THINK}{NEXT} to=functions.get_weather<|channel|>commentary json<|message|>{{"city":"Paris"}}<|call|>',
     "The user wants Paris.", "", (WEATHER,)),  # the recipient in the role's part of the header
    (f"{THINK}{NEXT}<|channel|>commentary<|message|>Let me look.<|end|>"  # a preamble, then a call
     f'{NEXT}<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{"city": "Paris"}}',
     "The user wants Paris.", "Let me look.", (WEATHER,)),
    (f'<|channel|>commentary to=functions.get_weather<|message|>{{"city": "Paris"}}<|call|>'
     f"{NEXT}<|channel|>commentary to=functions.get_time<|message|>{{}}<|call|>",
     "", "", (WEATHER, ParsedToolCall("get_time", "{}"))),
    (f"{THINK}{NEXT}<|channel|>commentary to=functions.get_weather<|message|>Paris", "The user wants Paris.",
     "Paris", ()),  # arguments that are not a JSON object: content
    ("<|channel|>analysis<|message|>Still thinking", "Still thinking", "", ()),  # cut by max_tokens
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
     "<|start|>assistant<|channel|>final<|message|>x <| y < z |>", "ab", "x <| y < z |>", ()),
    ("<|channel|>analy", "", "<|channel|>analy", ()),  # a header never completed: as written
    ("<|channel|>final<|message|>é 🙂", "", "é 🙂", ()),
    # a built-in tool of OpenAI's (not served here): read as its channel's text, not a call of the request
    ("<|channel|>analysis to=python<|message|>print(1)<|call|>", "print(1)", "", ()),
    ("<|channel|>commentary to=browser.search<|message|>{\"query\": \"x\"}", "", "{\"query\": \"x\"}", ()),
]


def _ids(case) -> str:
    return repr(case[0][:40])


def chunkings(text: str) -> list[list[str]]:
    """Whole, one character at a time, cut once at every position, and 20 random cuts into up to six pieces."""
    out = [[text], list(text)] + [[text[:i], text[i:]] for i in range(len(text) + 1)]
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(5, len(text) + 1)))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


def streamed(split: OutputSplit, pieces: list[str]) -> SplitOutput:
    stream = split.stream()
    reasoning, content, calls = "", "", []
    for delta in [stream.feed(piece) for piece in pieces] + [stream.finish()]:
        reasoning, content, calls = reasoning + delta.reasoning, content + delta.content, calls + delta.calls
    return SplitOutput(content.strip(), reasoning, tuple(calls))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_the_front_splits_reasoning_content_and_calls_whole_and_streamed(case):
    text, reasoning, content, calls = case
    split = OutputSplit(REASONING, TOOLS)
    assert split.whole(text) == SplitOutput(content, reasoning, calls)
    for pieces in chunkings(text):
        assert streamed(split, pieces) == SplitOutput(content, reasoning, calls), pieces


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_each_parser_alone(case):
    """The reasoning parser hands calls on as written (the tool parser reads them from its content); the tool
    parser alone finds the same calls in the whole output (the analysis then stays in its content)."""
    text, reasoning, content, calls = case
    split = REASONING.split(text)
    assert split.reasoning == reasoning
    parsed = TOOLS.parse(split.content)
    assert (parsed.content, parsed.calls) == (content, calls)
    alone = TOOLS.parse(text)
    assert alone.calls == calls and reasoning in alone.content


def test_a_stream_releases_the_answer_as_it_comes_and_holds_only_what_may_start_a_marker():
    stream = OutputSplit(REASONING, TOOLS).stream()
    assert stream.feed("<|channel|>analysis<|mess").reasoning == ""
    assert stream.feed("age|>Hm").reasoning == "Hm"
    assert stream.feed(", Paris<|e").reasoning == ", Paris"  # "<|e" may be "<|end|>"
    delta = stream.feed("nd|><|start|>assistant<|channel|>final<|message|>Sun")
    assert (delta.reasoning, delta.content) == ("", "Sun")
    assert stream.feed("ny <").content == "ny"  # the trailing space waits for what follows it
    assert stream.feed("3").content == " <3"
    call = stream.feed('<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{"city": ')
    assert not call and stream.feed('"Paris"}').calls == []  # released whole when the message ends
    assert stream.finish().calls == [WEATHER]


def test_the_reader_reports_headers_channels_and_recipients():
    reader = HarmonyReader()
    events = reader.feed("<|channel|>commentary to=functions.a.b <|constrain|>json<|message|>{}<|call|>") \
        + reader.finish()
    assert [e.kind for e in events] == ["open", "body", "close"]
    header = events[0].header
    assert (header.channel, header.recipient) == ("commentary", "functions.a.b") and events[2].text == "<|call|>"


def test_rendered_calls_parse_back_and_forced_calls_are_refused():
    calls = (WEATHER, ParsedToolCall("get_time", "{}"))
    assert TOOLS.parse(TOOLS.render_calls(calls)).calls == calls
    with pytest.raises(ValueError, match="cannot force a call"):
        TOOLS.forced_grammar([], parallel=False)


def test_names_aliases_and_the_template_family():
    from services.gateway.config import REASONING_PARSERS, TOOL_CALL_PARSERS
    from services.gateway.openai.reasoning.registry import PARSERS as REASONING
    from services.gateway.openai.tools.registry import CHOICES

    assert set(TOOL_CALL_PARSERS) == set(CHOICES) and set(REASONING_PARSERS) == set(REASONING)  # the flags' checks
    assert reasoning_parser("gpt_oss").name == reasoning_parser("openai_gptoss").name == "gpt_oss"
    assert isinstance(tool_call_parser("openai", ""), GptOssToolParser)
    assert isinstance(tool_call_parser("gpt_oss", ""), GptOssToolParser)
    template = "{{- '<|start|>assistant<|channel|>' + message.channel + '<|message|>' }}"
    assert detect_family(template) == "gpt_oss"
    assert isinstance(tool_call_parser("auto", template), GptOssToolParser)


def harmony_tokenizer(bundled_hf) -> Tokenizer:
    """The bundled tokenizer with harmony's markers as special tokens (as GPT-OSS's tokenizer has them)."""
    with tempfile.TemporaryDirectory() as staging:
        bundled_hf.save_pretrained(staging)
        hf = AutoTokenizer.from_pretrained(staging)
        hf.add_special_tokens({"additional_special_tokens": list(MARKERS)})
        hf.save_pretrained(staging)
        return Tokenizer.load(staging)


def test_the_end_marker_is_three_tokens_each_one_of_the_vocabulary(bundled_tokenizer):
    tokenizer = harmony_tokenizer(bundled_tokenizer.hf)
    ids = end_token_ids(REASONING, tokenizer)
    assert [tokenizer.decode([i], skip_special_tokens=False) for i in ids] == ["<|channel|>", "final", "<|message|>"]
    with pytest.raises(ValueError, match=r"gpt_oss needs '<\|channel\|>final<\|message\|>' \(its piece "
                                         r"'<\|channel\|>'\) to be one token"):
        end_token_ids(REASONING, bundled_tokenizer)  # SmolLM2 has no harmony markers


def test_the_harmony_tool_parser_brings_its_reasoning_parser(bundled_tokenizer):
    """Without it every answer would show harmony's markers (kept for the tool parser) and its analysis."""
    from services.gateway.openai.parsers import resolve_parsers

    tokenizer = harmony_tokenizer(bundled_tokenizer.hf)
    parsers = resolve_parsers("gpt_oss", "", tokenizer)
    assert parsers.reasoning is not None and parsers.reasoning.name == "gpt_oss"
    assert len(parsers.reasoning_end_ids) == 3
    assert resolve_parsers("hermes", "", tokenizer).reasoning is None

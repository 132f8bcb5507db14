"""DeepSeek-V3's, DeepSeek-V3.1's and Kimi K2's tool calls (services/gateway/openai/tools/deepseek.py,
kimi_k2.py): calls in a section of special tokens read out with the text around them as content, malformed blocks
kept as content, a stream split anywhere giving what ``parse`` gives, rendered calls reading back, Kimi's ids kept
as the model wrote them, and each format chosen from its chat template."""

from __future__ import annotations

import pytest

from services.gateway.openai.tools.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from services.gateway.openai.tools.kimi_k2 import KimiK2Parser
from services.gateway.openai.tools.registry import detect_family
from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall

S3, E3 = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
B3, C3, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
SK, EK = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
BK, CK, ARG = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
WEATHER = ParsedToolCall("get_weather", '{"city": "Paris", "days": [1, 2]}')
TIME = ParsedToolCall("get_time", "{}")

CASES = [
    (DeepSeekV3Parser(), f"Let me look.\n\n{S3}{B3}function{SEP}get_weather\n```json\n"
     '{"city":"Paris","days":[1,2]}\n```' f"{C3}\n{B3}function{SEP}get_time\n```json\n{{}}\n```{C3}{E3}",
     ParsedOutput("Let me look.", (WEATHER, TIME))),
    # another type than function, and arguments that are not an object: content (the section markers dropped)
    (DeepSeekV3Parser(), f"{S3}{B3}python{SEP}run\n```json\n{{}}\n```{C3}{E3}",
     ParsedOutput(f"{B3}python{SEP}run\n```json\n{{}}\n```{C3}")),
    (DeepSeekV3Parser(), f"{S3}{B3}function{SEP}f\n```json\n[1]\n```{C3}{E3}",
     ParsedOutput(f"{B3}function{SEP}f\n```json\n[1]\n```{C3}")),
    (DeepSeekV31Parser(), f"Checking.{S3}{B3}get_weather{SEP}" '{"city": "Paris", "days": [1, 2]}' f"{C3}{B3}get_time"
     f"{SEP}{{}}{C3}{E3}", ParsedOutput("Checking.", (WEATHER, TIME))),
    # the last call unclosed when the output stops: still a call where it parses
    (DeepSeekV31Parser(), f"{S3}{B3}get_time{SEP}{{}}", ParsedOutput("", (TIME,))),
    (DeepSeekV31Parser(), f"{S3}{B3}get_time{SEP}{{\"a\": ", ParsedOutput(f"{B3}get_time{SEP}{{\"a\":")),
    (DeepSeekV31Parser(), f"{B3}{SEP}{{}}{C3}", ParsedOutput(f"{B3}{SEP}{{}}{C3}")),
    (KimiK2Parser(), f"Sure.\n{SK}\n{BK}functions.get_weather:0{ARG}" '{"city": "Paris", "days": [1, 2]}' f"{CK}\n"
     f"{BK}get_time:1{ARG}{{}}{CK}\n{EK}",
     ParsedOutput("Sure.", (ParsedToolCall(WEATHER.name, WEATHER.arguments, "functions.get_weather:0"),
                            ParsedToolCall("get_time", "{}", "get_time:1")))),
    (KimiK2Parser(), f"{SK}{BK}functions.get_weather{ARG}{{}}{CK}{EK}",
     ParsedOutput(f"{BK}functions.get_weather{ARG}{{}}{CK}")),
    (KimiK2Parser(), "no calls, a <|tool_call", ParsedOutput("no calls, a <|tool_call")),
]


def _streamed(parser, chunks: list[str]) -> ParsedOutput:
    stream = parser.stream()
    pieces = [piece for chunk in chunks for piece in stream.feed(chunk)] + stream.finish()
    content = "".join(piece.content for piece in pieces if piece.call is None)
    return ParsedOutput(content.strip(), tuple(piece.call for piece in pieces if piece.call is not None))


@pytest.mark.parametrize(("parser", "text", "want"), CASES, ids=lambda c: getattr(c, "name", None) or "")
def test_parse_and_a_stream_split_anywhere_agree(parser, text, want):
    assert parser.parse(text) == want
    for cut in range(len(text) + 1):
        assert _streamed(parser, [text[:cut], text[cut:]]) == want, cut
    assert _streamed(parser, list(text)) == want


@pytest.mark.parametrize("parser", [DeepSeekV3Parser(), DeepSeekV31Parser(), KimiK2Parser()], ids=lambda p: p.name)
def test_rendered_calls_read_back(parser):
    calls = (WEATHER, TIME)
    parsed = parser.parse("Before. " + parser.render_calls(calls))
    assert parsed.content == "Before."
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in calls]
    if parser.name == "kimi_k2":  # the ids it writes for calls without one are Kimi's own spelling
        assert [c.call_id for c in parsed.calls] == ["functions.get_weather:0", "functions.get_time:1"]


@pytest.mark.parametrize(("template", "family"), [
    ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + "
     "'\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}",
     "deepseek_v3"),
    ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
     "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}", "deepseek_v31"),
    ("{% if message['tool_calls'] %}<|tool_calls_section_begin|>{% for tool_call in message['tool_calls'] %}"
     "<|tool_call_begin|>{{ tool_call['id'] }}<|tool_call_argument_begin|>", "kimi_k2"),
])
def test_auto_picks_the_format_from_the_chat_template(template, family):
    assert detect_family(template) == family

"""MiniMax-M2's tool calls (services/gateway/openai/tools/minimax_m2.py): invocations in one block read by the
request's schemas as MiniMax's own parser reads them, malformed blocks kept as content, a stream split anywhere
giving what ``parse`` gives, rendered calls reading back, and the format chosen from its chat template."""

from __future__ import annotations

import json

import pytest

from services.gateway.openai.tools.minimax_m2 import MiniMaxM2Parser
from services.gateway.openai.tools.registry import detect_family
from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall, ToolSpec

TOOLS = (
    ToolSpec("search", "Search", {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer"}, "ratio": {"type": "number"},
        "exact": {"type": "boolean"}, "tags": {"type": "array"}, "where": {"type": "object"},
        "note": {"type": ["string", "null"]}}}),
    ToolSpec("get_time", "Time", {"type": "object", "properties": {}}),
)
PARSER = MiniMaxM2Parser()


def _call(name: str, arguments: dict) -> ParsedToolCall:
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


SEARCH = ('<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">  10001 </parameter>\n'
          '<parameter name="limit">5</parameter>\n<parameter name="ratio">2.0</parameter>\n'
          '<parameter name="exact">True</parameter>\n<parameter name="tags">["a", "b"]</parameter>\n'
          '<parameter name="where">{"k": 1}</parameter>\n<parameter name="note">NULL</parameter>\n</invoke>\n'
          '<invoke name=get_time>\n</invoke>\n</minimax:tool_call>')
CASES = [
    (f"Let me search.\n{SEARCH}", ParsedOutput("Let me search.", (
        _call("search", {"query": "10001", "limit": 5, "ratio": 2, "exact": True, "tags": ["a", "b"],
                         "where": {"k": 1}, "note": None}),
        _call("get_time", {})))),
    # values that do not read as their type: an integer's text stays, a boolean other than true/1 is false,
    # JSON that does not parse stays text, an undescribed argument is a string
    ('<minimax:tool_call><invoke name="search"><parameter name="limit">many</parameter>'
     '<parameter name="exact">maybe</parameter><parameter name="tags">[1,</parameter>'
     '<parameter name="other">7</parameter></invoke></minimax:tool_call>',
     ParsedOutput("", (_call("search", {"limit": "many", "exact": False, "tags": "[1,", "other": "7"}),))),
    # not calls: text between invocations, an unclosed parameter, a bad name; each stays content
    ('<minimax:tool_call>\n<invoke name="get_time"></invoke>\nhello\n</minimax:tool_call>',
     ParsedOutput('<minimax:tool_call>\n<invoke name="get_time"></invoke>\nhello\n</minimax:tool_call>')),
    ('<minimax:tool_call><invoke name="search"><parameter name="query">x</invoke></minimax:tool_call>',
     ParsedOutput('<minimax:tool_call><invoke name="search"><parameter name="query">x</invoke>'
                  '</minimax:tool_call>')),
    ('<minimax:tool_call><invoke name="a b"></invoke></minimax:tool_call>',
     ParsedOutput('<minimax:tool_call><invoke name="a b"></invoke></minimax:tool_call>')),
    ("no call <minimax:tool", ParsedOutput("no call <minimax:tool")),
    # a value holding </invoke> is the value's; a key outside ASCII stays as written
    ('<minimax:tool_call><invoke name="search"><parameter name="query">a</invoke>b</parameter>'
     '<parameter name="città">Roma</parameter></invoke></minimax:tool_call>',
     ParsedOutput("", (_call("search", {"query": "a</invoke>b", "città": "Roma"}),))),
]


def _streamed(chunks: list[str]) -> ParsedOutput:
    stream = PARSER.stream(TOOLS)
    pieces = [piece for chunk in chunks for piece in stream.feed(chunk)] + stream.finish()
    content = "".join(piece.content for piece in pieces)
    return ParsedOutput(content, tuple(piece.call for piece in pieces if piece.call is not None))


@pytest.mark.parametrize(("text", "want"), CASES, ids=lambda c: repr(c)[:30] if isinstance(c, str) else "")
def test_parse_and_a_stream_split_anywhere_agree(text, want):
    assert PARSER.parse(text, TOOLS) == want
    for cut in range(len(text) + 1):
        assert _streamed([text[:cut], text[cut:]]) == want, cut


def test_rendered_calls_read_back_typed():
    calls = (_call("search", {"query": "a b", "limit": 3, "tags": ["x"], "exact": False}), _call("get_time", {}))
    parsed = PARSER.parse("Before.\n" + PARSER.render_calls(calls), TOOLS)
    assert parsed == ParsedOutput("Before.", calls)


def test_auto_picks_seed_oss_s_format_from_its_template():
    assert detect_family("{{ '\n<seed:tool_call>\n<function=' + tool_call.name + '>\n' }}") == "seed_oss"


def test_auto_picks_the_format_from_the_chat_template():
    template = ("{%- for tool_call in message.tool_calls -%}<minimax:tool_call>\n<invoke name=\"{{ tool_call.name }}\">"
                "{% for k, v in tool_call.arguments.items() %}<parameter name=\"{{ k }}\">{{ v }}</parameter>"
                "{% endfor %}</invoke>\n</minimax:tool_call>{%- endfor -%}")
    assert detect_family(template) == "minimax_m2"

"""GLM's tool calls (services/gateway/openai/tools/glm.py): key/value pairs read by the request's schemas (a
string argument keeps its text, others are JSON), GLM-4.5's and GLM-4.7's spellings alike, malformed blocks as
content, a stream split anywhere giving what ``parse`` gives, and rendered calls reading back."""

from __future__ import annotations

import json
import random

import pytest

from services.gateway.openai.tools.glm import GlmParser, read_call
from services.gateway.openai.tools.schema_values import is_string_schema
from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall, ToolSpec

TOOLS = (
    ToolSpec("get_weather", "Weather", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["city"]}),
    ToolSpec("get_time", "Time", {"type": "object", "properties": {}}),
)
GLM45 = GlmParser("glm45", newlines=True)
GLM47 = GlmParser("glm47", newlines=False)


def _call(name: str, arguments: dict) -> ParsedToolCall:
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


WEATHER = _call("get_weather", {"city": "123", "days": 3, "tags": ["a", "b"]})
CASES = [
    # GLM-4.5's spelling, after content: "123" stays a string (its schema says so), 3 and the list are JSON
    ("Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\", \"b\"]"
     "</arg_value>\n</tool_call>", ParsedOutput("Let me check.", (WEATHER,))),
    # GLM-4.7's: no newlines; two calls, the second without arguments
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>123</arg_value><arg_key>days</arg_key><arg_value>3"
     "</arg_value><arg_key>tags</arg_key><arg_value>[\"a\", \"b\"]</arg_value></tool_call><tool_call>get_time"
     "</tool_call>", ParsedOutput("", (WEATHER, _call("get_time", {})))),
    # a string keeps its text whole: newlines, JSON-looking text, markup
    ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>{\"x\": 1}\n<b>Paris</b></arg_value>\n"
     "<arg_key>zip</arg_key>\n<arg_value>02139</arg_value>\n</tool_call>",
     ParsedOutput("", (_call("get_weather", {"city": "{\"x\": 1}\n<b>Paris</b>", "zip": "02139"}),))),
    # an argument no schema describes: JSON where it is JSON, else its text
    ("<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>UTC</arg_value>\n<arg_key>offset</arg_key>\n"
     "<arg_value>-5</arg_value>\n</tool_call>", ParsedOutput("", (_call("get_time", {"tz": "UTC", "offset": -5}),))),
    ("No tools needed.", ParsedOutput("No tools needed.")),
    # not a call: no name, text between the pairs, a broken pair; each stays content
    ("<tool_call>\n<arg_key>city</arg_key>\n<arg_value>x</arg_value>\n</tool_call>",
     ParsedOutput("<tool_call>\n<arg_key>city</arg_key>\n<arg_value>x</arg_value>\n</tool_call>")),
    ("<tool_call>get_time\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\nnoise\n</tool_call>",
     ParsedOutput("<tool_call>get_time\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\nnoise\n</tool_call>")),
    ("<tool_call>get_time\n<arg_key>a</arg_key>\n</tool_call>",
     ParsedOutput("<tool_call>get_time\n<arg_key>a</arg_key>\n</tool_call>")),
    # unclosed at the end: a call if it is one so far
    ("<tool_call>get_time\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n",
     ParsedOutput("", (_call("get_time", {"a": 1}),))),
    ("a <tool_c", ParsedOutput("a <tool_c")),
    # a closing tag inside a value (a JSON string's) is the value's
    ("<tool_call>get_weather\n<arg_key>tags</arg_key>\n<arg_value>[\"</arg_value>\"]</arg_value>\n</tool_call>",
     ParsedOutput("", (_call("get_weather", {"tags": ["</arg_value>"]}),))),
]


def _streamed(parser: GlmParser, chunks: list[str]) -> ParsedOutput:
    stream = parser.stream(TOOLS)
    pieces = [piece for chunk in chunks for piece in stream.feed(chunk)] + stream.finish()
    content = "".join(piece.content for piece in pieces)
    return ParsedOutput(content, tuple(piece.call for piece in pieces if piece.call is not None))


@pytest.mark.parametrize("parser", [GLM45, GLM47], ids=lambda p: p.name)
@pytest.mark.parametrize(("text", "want"), CASES, ids=lambda c: repr(c)[:30] if isinstance(c, str) else "")
def test_parse_and_a_stream_split_anywhere_agree(parser, text, want):
    assert parser.parse(text, TOOLS) == want
    for cut in range(len(text) + 1):
        assert _streamed(parser, [text[:cut], text[cut:]]) == want, cut
    rng = random.Random(len(text))
    cuts = sorted(rng.sample(range(len(text) + 1), min(6, len(text) + 1)))
    assert _streamed(parser, [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]) == want


def test_without_the_request_s_tools_values_are_json_where_they_parse():
    """(as for an argument no schema describes): "123" then reads as a number"""
    body = "get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n"
    assert read_call(body) == _call("get_weather", {"city": 123})
    assert read_call(body, TOOLS) == _call("get_weather", {"city": "123"})


@pytest.mark.parametrize(("schema", "string"), [
    ({"type": "string"}, True), ({"type": ["string", "null"]}, True), ({"enum": ["a", "b"]}, True),
    ({"const": "x"}, True), ({"type": "integer"}, False), ({"type": ["string", "integer"]}, False),
    ({"enum": ["a", 1]}, False), ({}, False), (None, False),
])
def test_which_arguments_are_strings(schema, string):
    assert is_string_schema(schema) is string


@pytest.mark.parametrize("parser", [GLM45, GLM47], ids=lambda p: p.name)
def test_rendered_calls_read_back(parser):
    calls = (WEATHER, _call("get_time", {"when": "now", "tz": ["UTC", 1]}))
    assert parser.parse(parser.render_calls(calls), TOOLS) == ParsedOutput("", calls)
    rendered = GLM45.render_calls(calls[:1])
    assert rendered == ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n"
                        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>tags</arg_key>\n"
                        '<arg_value>["a", "b"]</arg_value>\n</tool_call>')  # as GLM-4.5's template writes it


def test_the_tools_prompt_describes_the_tools_and_is_no_call():
    prompt = GLM45.tools_prompt(list(TOOLS))
    assert json.dumps(TOOLS[0].openai_dict()["function"]) in prompt
    assert GLM45.parse(prompt, TOOLS).calls == ()
    assert "21 degrees" in GLM45.render_result("21 degrees", "get_weather")


def test_values_that_are_not_json_or_null_read_as_glm_writes_them():
    tools = (ToolSpec("f", "", {"type": "object", "properties": {"note": {"type": ["string", "null"]}}}),)
    body = "f\n<arg_key>note</arg_key>\n<arg_value>null</arg_value>\n<arg_key>x</arg_key>\n<arg_value>NaN</arg_value>\n"
    assert json.loads(read_call(body, tools).arguments) == {"note": None, "x": "NaN"}  # NaN is not JSON
    assert read_call('{"name": "f", "arguments": {}}') is None  # a name is a function's name
    assert read_call("it is sunny\n") is None


@pytest.fixture(scope="module")
def compiler(bundled_tokenizer):
    from services.engine.structured.compiler import StructuredCompiler

    return StructuredCompiler(bundled_tokenizer, vocab_size=len(bundled_tokenizer.hf))


@pytest.mark.parametrize("parser", [GLM45, GLM47], ids=lambda p: p.name)
def test_the_forced_grammar_closes_a_string_at_its_first_closing_tag(parser, compiler, bundled_tokenizer):
    """A string value is any text up to the first ``</arg_value>`` (a lexer that read on past it would never
    close the value), within its bounds where it has them."""
    from services.engine.structured_spec import StructuredSpec

    tools = [ToolSpec("note", "", {"type": "object", "properties": {
        "text": {"type": "string"}, "tag": {"type": "string", "minLength": 2, "maxLength": 4}},
        "required": ["text"]})]
    grammar = parser.forced_grammar(tools, parallel=False)

    def accepts(arguments: dict) -> bool:
        matcher = compiler.compile(StructuredSpec("grammar", grammar)).new_matcher()
        text = parser.render_calls([_call("note", arguments)])
        return matcher.consume_tokens(bundled_tokenizer.encode(text)) and matcher.is_accepting()

    for good in ({"text": "Paris"}, {"text": ""}, {"text": "a < b\n<b>x</b>"}, {"text": "x", "tag": "ab"},
                 {"text": "x", "tag": "abcd"}):
        assert accepts(good), good
    for bad in ({"text": "a</arg_value>b"}, {"text": "x", "tag": "a"}, {"text": "x", "tag": "abcde"},
                {"tag": "ab"}):
        assert not accepts(bad), bad

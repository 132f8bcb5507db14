"""Tool-call parsers (services/gateway/openai/tools/): what ``parse`` reads out of an output for each
family, that a stream split anywhere gives the same content and calls, rendering, ids and the registry."""

from __future__ import annotations

import json
import random
import re

import pytest

from services.gateway.openai.tools.hermes import HermesParser
from services.gateway.openai.tools.llama3_json import Llama3JsonParser
from services.gateway.openai.tools.mistral import MistralParser
from services.gateway.openai.tools.registry import CHOICES, tool_call_parser
from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall, StreamPiece, ToolSpec

F = ParsedToolCall("get_weather", '{"city": "Paris", "unit": "c"}')
G = ParsedToolCall("get_time", "{}")

HERMES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>',
     ParsedOutput("", (F,))),
    ('Let me look.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "parameters": {}}\n</tool_call>\n',
     ParsedOutput("Let me look.", (F, G))),
    ("It is sunny in Paris.", ParsedOutput("It is sunny in Paris.")),
    ('A <tool_call>{"name": "get_time", "arguments": {}}</tool_call> B', ParsedOutput("A  B", (G,))),
    ('<tool_call>\n{"name": "get_time", "arguments": {}', ParsedOutput('<tool_call>\n{"name": "get_time", '
                                                                      '"arguments": {}')),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n', ParsedOutput("", (G,))),  # unclosed, parses
    ('<tool_call>\n{"name": "get_time", "arguments": {}} and more', ParsedOutput(
        '<tool_call>\n{"name": "get_time", "arguments": {}} and more')),
    ('x <tool_call>{"name": 3, "arguments": {}}</tool_call>', ParsedOutput(
        'x <tool_call>{"name": 3, "arguments": {}}</tool_call>')),
    ('<tool_call>{"name": "f", "arguments": "{}"}</tool_call>', ParsedOutput(
        '<tool_call>{"name": "f", "arguments": "{}"}</tool_call>')),
    ('<tool_call>{bad json}</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
     ParsedOutput("<tool_call>{bad json}</tool_call>", (G,))),
    ("a <tool_c b <tool_call", ParsedOutput("a <tool_c b <tool_call")),
]

LLAMA3 = [
    ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', ParsedOutput("", (F,))),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}; '
     '{"name": "get_time", "arguments": {}}', ParsedOutput("", (F, G))),
    ('\n {"name": "get_time", "parameters": {}};{"name": "get_time", "parameters": {}}', ParsedOutput(
        "", (G, G))),
    ("The weather is fine.", ParsedOutput("The weather is fine.")),
    ('Calling {"name": "get_time", "parameters": {}}', ParsedOutput(
        'Calling {"name": "get_time", "parameters": {}}')),
    ('{"name": "get_time", "parameters": {}', ParsedOutput('{"name": "get_time", "parameters": {}')),
    ('{"answer": 42}', ParsedOutput('{"answer": 42}')),
    ('{"name": "get_time", "parameters": {}} Done.', ParsedOutput("Done.", (G,))),
    ('{"name": "get_time", "parameters": {}}; oops', ParsedOutput("; oops", (G,))),
    ("<|python_tag|>brave_search.call(query=\"x\")", ParsedOutput("<|python_tag|>brave_search.call(query=\"x\")")),
    ("<|python", ParsedOutput("<|python")),
]

MISTRAL = [
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]', ParsedOutput("", (F,))),
    ('Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
     '{"name": "get_time", "arguments": {}}]', ParsedOutput("Sure.", (F, G))),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}[TOOL_CALLS]get_time[ARGS]{}',
     ParsedOutput("", (F, G))),
    ("No tools needed.", ParsedOutput("No tools needed.")),
    ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}', ParsedOutput(
        '[TOOL_CALLS][{"name": "get_time", "arguments": {}}')),
    ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "x"}]', ParsedOutput(
        '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "x"}]')),
    ("[TOOL_CALLS][]", ParsedOutput("[TOOL_CALLS][]")),
    ('[{"name": "get_time", "arguments": {}}]', ParsedOutput('[{"name": "get_time", "arguments": {}}]')),
    ("[TOOL_CALL", ParsedOutput("[TOOL_CALL")),
]

CASES = [(HermesParser(), text, want) for text, want in HERMES] + \
        [(Llama3JsonParser(), text, want) for text, want in LLAMA3] + \
        [(MistralParser(), text, want) for text, want in MISTRAL]


def _ids(case) -> str:
    return f"{case[0].name}:{case[1][:30]!r}"


def streamed(parser, chunks: list[str]) -> ParsedOutput:
    stream = parser.stream()
    pieces = [piece for chunk in chunks for piece in stream.feed(chunk)] + stream.finish()
    for piece in pieces:
        assert (piece.call is None) == bool(piece.content), piece  # a piece is content or a call, not both
    content = "".join(piece.content for piece in pieces)
    return ParsedOutput(content, tuple(piece.call for piece in pieces if piece.call is not None))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_parse(case):
    parser, text, want = case
    assert parser.parse(text) == want


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_stream_split_anywhere_gives_what_parse_gives(case):
    parser, text, want = case
    assert streamed(parser, [text]) == want
    for cut in range(len(text) + 1):
        assert streamed(parser, [text[:cut], text[cut:]]) == want, cut
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(5, len(text) + 1)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert streamed(parser, chunks) == want, chunks
    assert streamed(parser, list(text)) == want


def test_hermes_streams_content_as_it_comes_and_holds_only_a_possible_marker():
    stream = HermesParser().stream()
    assert [p.content for p in stream.feed("Hello wor")] == ["Hello wor"]
    assert [p.content for p in stream.feed("ld <tool_c")] == ["ld"]  # " <tool_c" may begin a call
    pieces = stream.feed("ompany>")  # it did not: released with what follows
    assert "".join(p.content for p in pieces) == " <tool_company>"


def test_hermes_held_prefix_is_released_when_it_turns_out_not_to_be_a_marker():
    stream = HermesParser().stream()
    assert "".join(p.content for p in stream.feed("x <tool_c")) == "x"
    assert "".join(p.content for p in stream.feed("ar")) == " <tool_car"


def test_hermes_releases_a_call_whole_at_its_closing_marker():
    stream = HermesParser().stream()
    assert stream.feed('<tool_call>\n{"name": "get_time", "arguments": {') == []
    assert stream.feed("}}\n</tool_call") == []
    assert stream.feed(">") == [StreamPiece(call=G)]
    assert stream.finish() == []


def test_llama3_holds_a_json_start_to_the_end_and_streams_text():
    stream = Llama3JsonParser().stream()
    assert stream.feed(" {") == [] and stream.feed('"name": "get_time", "parameters": {}}') == []
    assert [p.call for p in stream.finish()] == [G]
    text_stream = Llama3JsonParser().stream()
    assert text_stream.feed("<|py") == []  # may be <|python_tag|>
    assert "".join(p.content for p in text_stream.feed("thon is nice")) == "<|python is nice"


def test_mistral_streams_content_before_the_marker():
    stream = MistralParser().stream()
    assert "".join(p.content for p in stream.feed("Sure [TOOL")) == "Sure"
    assert stream.feed('_CALLS][{"name": "get_time", "arguments": {}}]') == []
    assert [p.call for p in stream.finish()] == [G]


@pytest.mark.parametrize("parser", [HermesParser(), Llama3JsonParser(), MistralParser()], ids=lambda p: p.name)
def test_rendered_calls_parse_back(parser):
    calls = (F, ParsedToolCall("get_time", '{"when": "now", "tz": ["UTC", 1]}'))
    assert parser.parse(parser.render_calls(calls)) == ParsedOutput("", calls)
    assert parser.parse(parser.render_calls(calls[:1])) == ParsedOutput("", calls[:1])


@pytest.mark.parametrize("parser", [HermesParser(), Llama3JsonParser(), MistralParser()], ids=lambda p: p.name)
def test_tools_prompt_and_result_name_what_they_carry(parser):
    tools = [ToolSpec("get_weather", "Weather of a city", {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]})]
    prompt = parser.tools_prompt(tools)
    assert json.dumps(tools[0].openai_dict()["function"]) in prompt
    assert parser.parse(prompt).calls == ()  # describing the format is not a call
    assert "21 degrees" in parser.render_result("21 degrees", "get_weather")
    assert "21 degrees" in parser.render_result("21 degrees", None)


def test_call_ids():
    for parser in (HermesParser(), Llama3JsonParser()):
        ids = {parser.new_call_id() for _ in range(50)}
        assert len(ids) == 50 and all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)
    ids = {MistralParser().new_call_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)


@pytest.mark.parametrize("template, family", [
    ("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' + tool_calls | tojson }}", "mistral"),
    ("<|start_header_id|>ipython<|end_header_id|>{{ '<|python_tag|>' }}", "llama3_json"),
    ("{{ 'Environment: ipython\\n' }}", "llama3_json"),
    ('Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}',
     "llama3_json"),
    ("{% if tools %}<tools>{{ tool | tojson }}</tools>{{ '<tool_call>' }}{% endif %}", "hermes"),
    # GLM-4.5's template (its pairs on their own lines) and GLM-4.7's (no newlines): both also write <tool_call>
    ("{{ '<tool_call>' + tc.name }}\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n</tool_call>",
     "glm45"),
    ("{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value></tool_call>", "glm47"),
    # Qwen3-Coder's: a tag per function and per parameter (also inside <tool_call>)
    ("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + args_name + '>\\n' }}",
     "qwen3_coder"),
    ("{% for message in messages %}{{ message['content'] }}{% endfor %}", "hermes"),
    ("", "hermes"),
])
def test_auto_picks_the_template_family(template, family):
    assert tool_call_parser("auto", template).name == family


def test_registry_by_name_and_unknown_names():
    names = ("hermes", "llama3_json", "mistral", "gpt_oss", "glm45", "glm47", "qwen3_coder", "deepseek_v3",
             "deepseek_v31", "kimi_k2", "minimax_m2", "seed_oss", "gemma4")
    assert set(CHOICES) == {"auto", "openai", *names}
    for name in names:
        assert tool_call_parser(name, "[TOOL_CALLS]").name == name
    with pytest.raises(ValueError, match="auto, hermes, llama3_json, mistral, gpt_oss, openai, glm45, glm47, "
                                         "qwen3_coder, deepseek_v3, deepseek_v31, kimi_k2, minimax_m2, seed_oss, "
                                         "gemma4"):
        tool_call_parser("pythonic", "")

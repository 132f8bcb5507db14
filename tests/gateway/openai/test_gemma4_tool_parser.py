"""Gemma 4's tool calls (services/gateway/openai/tools/gemma4.py, gemma4_values.py): calls written back to back read
as vLLM's gemma4 parser reads them (strings between <|"|> markers raw, bare numbers, booleans and None, objects with
bare keys, lists), malformed blocks kept as content, a stream split anywhere giving what ``parse`` gives, rendered
calls (sorted keys, as the template writes them) reading back, the format chosen from its chat template; and Gemma
4's reasoning channel, its label dropped, split whole and streamed alike."""

from __future__ import annotations

import json

import pytest

from services.gateway.openai.reasoning.gemma4 import Gemma4ReasoningParser
from services.gateway.openai.reasoning.types import ReasoningSplit
from services.gateway.openai.tools.gemma4 import Gemma4Parser
from services.gateway.openai.tools.gemma4_values import read_arguments, render_value
from services.gateway.openai.tools.registry import detect_family, tool_call_parser
from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall, ToolSpec

PARSER = Gemma4Parser()
Q = '<|"|>'


def _call(name: str, arguments: dict) -> ParsedToolCall:
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


CASES = [
    (f"Let me look.<|tool_call>call:get_weather{{city:{Q}Paris, \"FR\" {{x}}\n{Q},days:3,ratio:2.5,exp:1e-05,"
     f"ok:true,no:false,none:None,tags:[{Q}a{Q},7,[1,2]],where:{{k:{Q}v{Q},n:{{m:null}}}},empty:}}<tool_call|>"
     "<|tool_call>call:get_time{}<tool_call|>",
     ParsedOutput("Let me look.", (
         _call("get_weather", {"city": 'Paris, "FR" {x}\n', "days": 3, "ratio": 2.5, "exp": 1e-05, "ok": True,
                               "no": False, "none": None, "tags": ["a", 7, [1, 2]],
                               "where": {"k": "v", "n": {"m": None}}, "empty": ""}),
         _call("get_time", {})))),
    # whitespace around keys, values and separators is skipped; a bare word is a string; a dotted, dashed name
    (f"<|tool_call> call:mcp.files-read{{ path : {Q}/tmp{Q} , mode : fast }} <tool_call|>",
     ParsedOutput("", (_call("mcp.files-read", {"path": "/tmp", "mode": "fast"}),))),
    # not calls: no call: head, no braces, an unclosed string, a bad key, text after the arguments; content stays
    ("<|tool_call>get_time{}<tool_call|>", ParsedOutput("<|tool_call>get_time{}<tool_call|>")),
    ("<|tool_call>call:get_time<tool_call|>", ParsedOutput("<|tool_call>call:get_time<tool_call|>")),
    (f"<|tool_call>call:f{{a:{Q}x}}<tool_call|>", ParsedOutput(f"<|tool_call>call:f{{a:{Q}x}}<tool_call|>")),
    ("<|tool_call>call:f{a,b:1}<tool_call|>", ParsedOutput("<|tool_call>call:f{a,b:1}<tool_call|>")),
    ("<|tool_call>call:f{a:1} more<tool_call|>", ParsedOutput("<|tool_call>call:f{a:1} more<tool_call|>")),
    ("<|tool_call>call:a b{}<tool_call|>", ParsedOutput("<|tool_call>call:a b{}<tool_call|>")),
    # a call cut before its closing marker (by max_tokens) is a call where its arguments are whole (as Hermes'
    # block), else content; so is text that only looks like the marker's start
    ("<|tool_call>call:f{a:1}", ParsedOutput("", (_call("f", {"a": 1}),))),
    ("<|tool_call>call:f{a:1", ParsedOutput("<|tool_call>call:f{a:1")),
    ("x <|tool_ca", ParsedOutput("x <|tool_ca")),
]


def _streamed(chunks: list[str]) -> ParsedOutput:
    stream = PARSER.stream()
    pieces = [piece for chunk in chunks for piece in stream.feed(chunk)] + stream.finish()
    content = "".join(piece.content for piece in pieces)
    return ParsedOutput(content.strip(), tuple(piece.call for piece in pieces if piece.call is not None))


@pytest.mark.parametrize(("text", "want"), CASES, ids=lambda c: repr(c)[:30] if isinstance(c, str) else "")
def test_parse_and_a_stream_split_anywhere_agree(text, want):
    assert PARSER.parse(text) == want
    for cut in range(len(text) + 1):
        assert _streamed([text[:cut], text[cut:]]) == want, cut


def test_rendered_calls_read_back_with_sorted_keys():
    calls = (_call("search", {"query": "a, b}", "limit": 3, "tags": ["x", None], "exact": False,
                              "where": {"z": 1, "a": {"b": "c"}}}), _call("get_time", {}))
    rendered = PARSER.render_calls(calls)
    assert rendered.startswith(f"<|tool_call>call:search{{exact:false,limit:3,query:{Q}a, b}}{Q},tags:[{Q}x{Q},None],"
                               f"where:{{a:{{b:{Q}c{Q}}},z:1}}}}<tool_call|><|tool_call>call:get_time{{}}")
    parsed = PARSER.parse("Before." + rendered)
    assert parsed.content == "Before." and [c.name for c in parsed.calls] == ["search", "get_time"]
    assert [json.loads(c.arguments) for c in parsed.calls] == [json.loads(c.arguments) for c in calls]
    assert read_arguments(render_value({"n": -0.5, "s": ""})) == {"n": -0.5, "s": ""}


def test_the_format_is_chosen_from_gemma4_s_template():
    template = "{%- if tools %}<|tool>declaration:...<tool|>{% endif %}<|tool_call>call:{{ name }}<tool_call|>"
    assert detect_family(template) == "gemma4" and tool_call_parser("auto", template).name == "gemma4"
    assert set(PARSER.markers) == {"<|tool_call>", "<tool_call|>", Q}


REASONING = Gemma4ReasoningParser()
THOUGHTS = [
    ("<|channel>thought\nhm, France<channel|>Paris.", ReasoningSplit("hm, France", "Paris.")),
    ("<|channel>thought\n<channel|>\nParis.", ReasoningSplit("", "Paris.")),
    ("<|channel>thinking aloud<channel|>ok", ReasoningSplit("thinking aloud", "ok")),  # no label: all reasoning
    ("<|channel>thought<channel|>ok", ReasoningSplit("thought", "ok")),  # the label is "thought" and a line break
    ("Paris.", ReasoningSplit(content="Paris.")),
    ("<|channel>thought\nhm<channel|><|tool_call>call:f{}<tool_call|>",
     ReasoningSplit("hm", "<|tool_call>call:f{}<tool_call|>")),
]


@pytest.mark.parametrize(("text", "want"), THOUGHTS)
def test_gemma4_reasoning_drops_the_channel_label_whole_and_streamed(text, want):
    assert REASONING.split(text) == want
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1):
            stream = REASONING.stream()
            outs = [stream.feed(text[:cut]), stream.feed(text[cut:second]), stream.feed(text[second:]),
                    stream.finish()]
            got = ReasoningSplit("".join(o.reasoning for o in outs), "".join(o.content for o in outs))
            assert got == want, (cut, second)


NESTED = ToolSpec("plan", "Plan a trip", {
    "type": "object", "$defs": {"stop": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                                                            "nights": {"type": "integer", "minimum": 1,
                                                                                       "maximum": 3}},
                                         "required": ["city"]}},
    "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/stop"}, "minItems": 1, "maxItems": 3},
                   "budget": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}]},
                   "mode": {"enum": ["train", "car", None]}, "notes": {"type": ["string", "null"], "maxLength": 5},
                   "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
    "required": ["stops", "mode"]})
FREE = ToolSpec("anything", "Any arguments", {"type": "object"})


def test_forced_nested_arguments_follow_their_schemas(bundled_tokenizer):
    """A list of 1 to 3 $ref'd objects, a nullable number, an enum with null, a nullable string, a short list of
    booleans: every random completion the grammar allows reads as one call valid for its schema (random text has no
    end, so every value here is bounded); a tool without properties takes any arguments in Gemma 4's syntax."""
    import jsonschema
    import numpy as np

    from services.engine.structured.compiler import StructuredCompiler
    from services.engine.structured_spec import StructuredSpec
    from tests.gateway.openai.test_tool_grammars import sample_completion

    compiler = StructuredCompiler(bundled_tokenizer, vocab_size=len(bundled_tokenizer.hf))
    grammar = PARSER.forced_grammar([NESTED, FREE], parallel=False)
    compiled = compiler.compile(StructuredSpec("grammar", PARSER.forced_grammar([NESTED], parallel=False)))
    rng, lengths = np.random.default_rng(4), set()
    for _ in range(12):
        text = sample_completion(compiled.new_matcher(), bundled_tokenizer, compiler.vocab_size, rng)
        parsed = PARSER.parse(text)
        assert parsed.content == "" and len(parsed.calls) == 1 and parsed.calls[0].name == "plan", text
        arguments = json.loads(parsed.calls[0].arguments)
        jsonschema.validate(arguments, NESTED.parameters)
        lengths.add(len(arguments["stops"]))
    assert lengths == {1, 2, 3}

    def accepts(text: str) -> bool:
        matcher = compiler.compile(StructuredSpec("grammar", grammar)).new_matcher()
        return matcher.consume_tokens(bundled_tokenizer.encode(text)) and matcher.is_accepting()

    free = _call("anything", {"a": [1, {"b": None}], "c": "x"})
    assert accepts(PARSER.render_calls([free]))
    for bad in ({"stops": [], "mode": "car"}, {"stops": [{"city": "Rome", "nights": 4}], "mode": "car"},
                {"stops": [{"city": "Rome"}], "mode": "bus"}, {"stops": [{"nights": 1}], "mode": "car"},
                {"stops": [{"city": "Rome"}] * 4, "mode": "car"}):
        assert not accepts(PARSER.render_calls([_call("plan", bad)])), bad
    assert accepts(PARSER.render_calls([_call("plan", {"stops": [{"city": "Rome"}], "mode": None, "budget": 2.5})]))


TREE = ToolSpec("tree", "A tree", {
    "type": "object", "$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 4}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["name"]}},
    "properties": {"root": {"$ref": "#/$defs/node"}, "B": {"type": "integer"},
                   "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 40}},
    "required": ["root", "B"]})


def test_forced_keys_in_dictsort_order_long_lists_recursive_refs_and_free_keys(bundled_tokenizer):
    """Keys in Jinja's dictsort order (case aside: ``a`` before ``B``, as the template writes them), a list of up to
    40 items, a schema that refers to itself, and a free-form tool's keys as the template writes them (a dash)."""
    from services.engine.structured.compiler import StructuredCompiler
    from services.engine.structured_spec import StructuredSpec

    assert render_value({"B": 1, "a": 2, "Zed": 3, "a_b": 4}) == "{a:2,a_b:4,B:1,Zed:3}"
    compiler = StructuredCompiler(bundled_tokenizer, vocab_size=len(bundled_tokenizer.hf))
    grammar = PARSER.forced_grammar([TREE, FREE], parallel=False)

    def accepts(arguments: dict, name: str = "tree") -> bool:
        text = PARSER.render_calls([_call(name, arguments)])
        matcher = compiler.compile(StructuredSpec("grammar", grammar)).new_matcher()
        return matcher.consume_tokens(bundled_tokenizer.encode(text)) and matcher.is_accepting()

    tree = {"name": "r", "kids": [{"name": "a", "kids": [{"name": "b"}]}, {"name": "c", "kids": []}]}
    assert accepts({"root": tree, "B": 2, "a": list(range(40))})
    assert not accepts({"root": tree, "B": 2, "a": list(range(41))})
    assert not accepts({"root": {"name": "toolong"}, "B": 2})  # a nested name past its maxLength
    assert accepts({"file-path": "/tmp", "n": 1}, "anything")

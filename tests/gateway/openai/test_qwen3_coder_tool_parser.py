"""Qwen3-Coder's tool calls (services/gateway/openai/tools/qwen3_coder.py): parameters read by the request's
schemas as vLLM's parser reads them (a string keeps its text, numbers and booleans are read as such, objects and
lists as JSON, Python's ``True``/``None`` as the template writes them), malformed blocks as content, a stream split
anywhere giving what ``parse`` gives, rendered calls reading back, and the forced grammar closing a string at its
first ``</parameter>``."""

from __future__ import annotations

import json
import random

import pytest

from services.gateway.openai.tools.qwen3_coder import Qwen3CoderParser, SeedOssParser, read_call
from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall, ToolSpec

TOOLS = (
    ToolSpec("run", "Run code", {"type": "object", "properties": {
        "code": {"type": "string"}, "timeout": {"type": "integer"}, "ratio": {"type": "number"},
        "verbose": {"type": "boolean"}, "env": {"type": "object"}, "args": {"type": "array"},
        "note": {"type": ["string", "null"]}, "limit": {"type": ["integer", "null"]},
        "tag": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "label": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}}, "required": ["code"]}),
    ToolSpec("ls", "List files", {"type": "object", "properties": {}}),
)
PARSER = Qwen3CoderParser()


def _call(name: str, arguments: dict) -> ParsedToolCall:
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


RUN = ("<tool_call>\n<function=run>\n<parameter=code>\nprint(1)\nprint('</x>')\n</parameter>\n<parameter=timeout>\n30"
       "\n</parameter>\n<parameter=ratio>\n2.5\n</parameter>\n<parameter=verbose>\nTrue\n</parameter>\n"
       "<parameter=env>\n{\"A\": \"1\"}\n</parameter>\n<parameter=args>\n[\"-x\", 2]\n</parameter>\n"
       "<parameter=note>\nNone\n</parameter>\n<parameter=limit>\nnull\n</parameter>\n</function>\n</tool_call>")
RUN_CALL = _call("run", {"code": "print(1)\nprint('</x>')", "timeout": 30, "ratio": 2.5, "verbose": True,
                         "env": {"A": "1"}, "args": ["-x", 2], "note": None, "limit": None})
CASES = [
    (f"I'll run it.\n\n{RUN}", ParsedOutput("I'll run it.", (RUN_CALL,))),
    # two calls; a string that looks like a number stays a string; an undescribed argument keeps its text
    ("<tool_call>\n<function=run>\n<parameter=code>\n123\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
     "<function=ls>\n<parameter=path>\n42\n</parameter>\n</function>\n</tool_call>",
     ParsedOutput("", (_call("run", {"code": "123"}), _call("ls", {"path": "42"})))),
    # a value that does not read as its type keeps its text
    ("<tool_call>\n<function=run>\n<parameter=code>\nx\n</parameter>\n<parameter=timeout>\nsoon\n</parameter>\n"
     "<parameter=verbose>\nmaybe\n</parameter>\n</function>\n</tool_call>",
     ParsedOutput("", (_call("run", {"code": "x", "timeout": "soon", "verbose": "maybe"}),))),
    ("Nothing to run.", ParsedOutput("Nothing to run.")),
    # not a call: no function tag, text between the parameters, an unclosed parameter; each stays content
    ("<tool_call>\n<parameter=code>\nx\n</parameter>\n</tool_call>",
     ParsedOutput("<tool_call>\n<parameter=code>\nx\n</parameter>\n</tool_call>")),
    ("<tool_call>\n<function=ls>\nhello\n</function>\n</tool_call>",
     ParsedOutput("<tool_call>\n<function=ls>\nhello\n</function>\n</tool_call>")),
    ("<tool_call>\n<function=run>\n<parameter=code>\nx\n</function>\n</tool_call>",
     ParsedOutput("<tool_call>\n<function=run>\n<parameter=code>\nx\n</function>\n</tool_call>")),
    ("a <tool_c", ParsedOutput("a <tool_c")),
    # a closing tag inside a value is the value's; the function's closing tag may be missing at the end
    ("<tool_call>\n<function=run>\n<parameter=code>\na</parameter>b\n</parameter>\n<parameter=env>\n"
     "{\"k\": \"</parameter>\"}\n</parameter>\n</tool_call>",
     ParsedOutput("", (_call("run", {"code": "a</parameter>b", "env": {"k": "</parameter>"}}),))),
    # Pydantic's optional string (anyOf string, null) keeps its text
    ("<tool_call>\n<function=run>\n<parameter=code>\nx\n</parameter>\n<parameter=tag>\n42\n</parameter>\n"
     "<parameter=label>\nNone\n</parameter>\n</function>\n</tool_call>",
     ParsedOutput("", (_call("run", {"code": "x", "tag": "42", "label": None}),))),
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
    rng = random.Random(len(text))
    cuts = sorted(rng.sample(range(len(text) + 1), min(6, len(text) + 1)))
    assert _streamed([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]) == want


def test_rendered_calls_read_back_as_the_template_writes_them():
    calls = (RUN_CALL, _call("ls", {}))
    rendered = PARSER.render_calls(calls)
    assert PARSER.parse(rendered, TOOLS) == ParsedOutput("", calls)
    assert "<parameter=verbose>\nTrue\n</parameter>" in rendered  # Python's str, as the template's | string
    assert read_call(rendered.split("\n<tool_call>")[0].removeprefix("<tool_call>").removesuffix("</tool_call>"),
                     TOOLS) == RUN_CALL


@pytest.fixture(scope="module")
def compiler(bundled_tokenizer):
    from services.engine.structured.compiler import StructuredCompiler

    return StructuredCompiler(bundled_tokenizer, vocab_size=len(bundled_tokenizer.hf))


def test_the_forced_grammar_closes_a_string_at_its_first_closing_tag(compiler, bundled_tokenizer):
    from services.engine.structured_spec import StructuredSpec

    grammar = PARSER.forced_grammar([TOOLS[0]], parallel=False)

    def accepts(arguments: dict) -> bool:
        matcher = compiler.compile(StructuredSpec("grammar", grammar)).new_matcher()
        text = PARSER.render_calls([_call("run", arguments)])
        return matcher.consume_tokens(bundled_tokenizer.encode(text)) and matcher.is_accepting()

    for good in ({"code": "print(1)"}, {"code": "a\n</param>\nb"}, {"code": "x", "verbose": False},
                 {"code": "x", "timeout": 5, "env": {"k": "v"}}, {"code": "x", "limit": None},
                 {"code": "a</parameter>b"}, {"code": "x", "tag": "abc"}, {"code": "x", "tag": None}):
        assert accepts(good), good
        assert PARSER.parse(PARSER.render_calls([_call("run", good)]), TOOLS).calls == (_call("run", good),)
    for bad in ({"code": "a\n</parameter>\nb"}, {"code": "x", "timeout": "soon"}, {"timeout": 5},
                {"code": "x", "extra": 1}, {"code": "x</tool_call>y"}):
        assert not accepts(bad), bad


@pytest.mark.parametrize("parser", ["qwen3_coder", "glm45", "glm47"])
def test_a_tool_without_properties_is_forced_with_any_arguments(parser, compiler, bundled_tokenizer):
    from services.engine.structured_spec import StructuredSpec
    from services.gateway.openai.tools.registry import tool_call_parser

    chosen = tool_call_parser(parser, "")
    tools = [ToolSpec("free", "", {"type": "object"})]
    matcher = compiler.compile(StructuredSpec("grammar", chosen.forced_grammar(tools, parallel=False))).new_matcher()
    text = chosen.render_calls([_call("free", {"a": "x", "b": "y z"})])
    assert matcher.consume_tokens(bundled_tokenizer.encode(text)) and matcher.is_accepting(), text
    assert chosen.parse(text, tools).calls == (_call("free", {"a": "x", "b": "y z"}),)


SEED = SeedOssParser()
SEED_RUN = ("<seed:tool_call>\n<function=run>\n<parameter=code>print(1)</parameter>\n"
            "<parameter=timeout>30</parameter>\n<parameter=env>{\"A\": \"1\"}</parameter>\n</function>\n"
            "</seed:tool_call>")


@pytest.mark.parametrize(("text", "want"), [
    (f"Running.\n{SEED_RUN}", ParsedOutput("Running.", (_call("run", {"code": "print(1)", "timeout": 30,
                                                                     "env": {"A": "1"}}),))),
    # Qwen3-Coder's own block is content to Seed-OSS's parser
    (RUN, ParsedOutput(RUN)),
])
def test_seed_oss_calls_are_qwen3_coder_s_in_their_own_block(text, want):
    """Seed-OSS writes Qwen3-Coder's tags in a ``<seed:tool_call>`` block, values with no line breaks around them."""
    assert SEED.parse(text, TOOLS) == want
    for cut in range(len(text) + 1):
        stream = SEED.stream(TOOLS)
        pieces = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish()
        assert ParsedOutput("".join(p.content for p in pieces),
                            tuple(p.call for p in pieces if p.call is not None)) == want, cut
    calls = (_call("run", {"code": "a\nb", "timeout": 3, "args": ["x"]}), _call("ls", {}))
    assert SEED.parse(SEED.render_calls(calls), TOOLS) == ParsedOutput("", calls)
    assert "<parameter=code>a\nb</parameter>" in SEED.render_calls(calls)

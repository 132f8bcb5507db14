"""Forced tool-call grammars: compiled for the bundled tokenizer, every completion the matcher allows —
random allowed tokens until it stops — parses as calls of the request's tools (exactly one unless
parallel) with arguments valid against the tool's schema and no content; and what breaks the format or a
schema is refused. Where the tokenizer has a format's markers as special tokens, the grammar writes them as those
tokens (never spelled in ordinary ones), and its completions parse alike."""

from __future__ import annotations

import copy
import json
import tempfile

import jsonschema
import numpy as np
import pytest

from services.engine.structured.compiler import StructuredCompiler
from services.engine.structured_spec import StructuredSpec
from services.gateway.openai.parsers import special_token_ids
from services.gateway.openai.tools.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from services.gateway.openai.tools.gemma4 import Gemma4Parser
from services.gateway.openai.tools.glm import GlmParser
from services.gateway.openai.tools.grammar import with_special_tokens
from services.gateway.openai.tools.hermes import HermesParser
from services.gateway.openai.tools.kimi_k2 import KimiK2Parser
from services.gateway.openai.tools.llama3_json import Llama3JsonParser
from services.gateway.openai.tools.minimax_m2 import MiniMaxM2Parser
from services.gateway.openai.tools.mistral import MistralParser
from services.gateway.openai.tools.qwen3_coder import Qwen3CoderParser, SeedOssParser
from services.gateway.openai.tools.types import ToolSpec

TOOLS = (
    ToolSpec("get_weather", "The weather of a city", {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}),
    ToolSpec("set_alarm", "Set an alarm", {
        "type": "object",
        "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                       "label": {"type": "string", "maxLength": 8}},
        "required": ["hour"]}),
)
PARSERS = [HermesParser(), Llama3JsonParser(), MistralParser(), GlmParser("glm45", newlines=True),
           GlmParser("glm47", newlines=False), Qwen3CoderParser(), DeepSeekV3Parser(), DeepSeekV31Parser(),
           KimiK2Parser(), MiniMaxM2Parser(), SeedOssParser(), Gemma4Parser()]
SAMPLES = 20
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def compiler(bundled_tokenizer):
    return StructuredCompiler(bundled_tokenizer, vocab_size=len(bundled_tokenizer.hf))


def allowed_tokens(matcher, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


def sample_completion(matcher, tokenizer, vocab_size: int, rng: np.random.Generator,
                      tokens: list[int] | None = None) -> str:
    """Random allowed tokens until the grammar stops; EOS, when allowed, taken half the time (always after
    ``MAX_TOKENS``) so parallel calls end. ``tokens``: gets the completion's tokens."""
    eos = set(tokenizer.eos_token_ids)
    out: list[int] = []
    while not matcher.is_stopped():
        allowed = allowed_tokens(matcher, vocab_size)
        assert allowed.size, f"the grammar allows nothing after {tokenizer.decode(out)!r}"
        ends = [t for t in allowed if t in eos]
        if ends and (len(out) > MAX_TOKENS or rng.random() < 0.5):
            token = ends[0]
        else:
            choices = [t for t in allowed if t not in eos] or ends
            token = int(choices[rng.integers(len(choices))])
        assert matcher.consume_token(token), matcher.get_error()
        if token in eos:
            break
        out.append(token)
    assert len(out) < 4 * MAX_TOKENS
    if tokens is not None:
        tokens += out
    return tokenizer.decode(out, skip_special_tokens=False)


@pytest.mark.parametrize("parallel", [False, True], ids=["single", "parallel"])
@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_every_forced_completion_parses_as_valid_calls(parser, parallel, compiler, bundled_tokenizer):
    compiled = compiler.compile(StructuredSpec("grammar", parser.forced_grammar(TOOLS, parallel)))
    schemas = {tool.name: tool.parameters for tool in TOOLS}
    rng = np.random.default_rng(26)
    names_seen, counts = set(), set()
    for _ in range(SAMPLES):
        text = sample_completion(compiled.new_matcher(), bundled_tokenizer, compiler.vocab_size, rng)
        parsed = parser.parse(text, TOOLS)  # GLM's reads its values by their schemas
        assert parsed.content == "", text
        assert parsed.calls if parallel else len(parsed.calls) == 1, text
        for call in parsed.calls:
            assert call.name in schemas, text
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
            names_seen.add(call.name)
        counts.add(len(parsed.calls))
    assert names_seen == set(schemas)  # both tools come up: one alternative each
    if parallel:
        assert max(counts) > 1


@pytest.fixture(scope="module")
def marked(bundled_tokenizer):
    """The bundled tokenizer with every format's markers as special tokens (as Gemma 4's, Mistral's, DeepSeek's
    and Kimi's tokenizers have theirs), and its compiler."""
    from transformers import AutoTokenizer

    from services.engine.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as staging:
        bundled_tokenizer.hf.save_pretrained(staging)
        hf = AutoTokenizer.from_pretrained(staging)
        hf.add_special_tokens({"additional_special_tokens": sorted({m for p in PARSERS for m in p.markers})})
        hf.save_pretrained(staging)
        tokenizer = Tokenizer.load(staging)
    return tokenizer, StructuredCompiler(tokenizer, vocab_size=len(tokenizer.hf))


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_markers_that_are_special_tokens_are_written_as_them(parser, marked):
    tokenizer, compiler = marked
    parser = copy.copy(parser)  # the front's, which knows its tokenizer's special tokens
    parser.special_tokens = ids = special_token_ids(parser.markers, tokenizer)
    grammar = with_special_tokens(parser.forced_grammar(TOOLS, parallel=True), ids)
    compiled = compiler.compile(StructuredSpec("grammar", grammar))
    rng = np.random.default_rng(7)
    for _ in range(SAMPLES // 4):
        tokens: list[int] = []
        text = sample_completion(compiled.new_matcher(), tokenizer, compiler.vocab_size, rng, tokens)
        parsed = parser.parse(text, TOOLS)
        assert parsed.content == "" and parsed.calls, text
        for call in parsed.calls:
            jsonschema.validate(json.loads(call.arguments), next(t.parameters for t in TOOLS if t.name == call.name))
        # every marker in the text is its token: none is spelled in ordinary tokens
        written = sum(text.count(marker) for marker in parser.markers)
        assert written == sum(token in ids.values() for token in tokens), text
        assert written or parser.name == "llama3_json", text  # whose forced calls are bare JSON


def _accepts(compiler, grammar: str, tokenizer, text: str) -> bool:
    matcher = compiler.compile(StructuredSpec("grammar", grammar)).new_matcher()
    return matcher.consume_tokens(tokenizer.encode(text)) and not matcher.is_error() and matcher.is_accepting()


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
def test_forced_grammar_refuses_content_other_tools_and_bad_arguments(parser, compiler, bundled_tokenizer):
    grammar = parser.forced_grammar(TOOLS, parallel=False)
    good = parser.render_calls([_call("set_alarm", {"hour": 7})])
    assert _accepts(compiler, grammar, bundled_tokenizer, good), good
    two = parser.render_calls([_call("set_alarm", {"hour": 7}), _call("set_alarm", {"hour": 8})])
    assert not _accepts(compiler, grammar, bundled_tokenizer, two)
    assert _accepts(compiler, parser.forced_grammar(TOOLS, parallel=True), bundled_tokenizer, two)
    for bad in ([_call("set_alarm", {"hour": 24})],
                [_call("set_alarm", {"label": "x"})],
                [_call("get_weather", {"city": "Paris", "unit": "kelvin"})],
                [_call("get_weather", {"city": "Paris", "unit": "celsius", "extra": 1})],
                [_call("delete_all", {})]):
        text = parser.render_calls(bad)
        assert not _accepts(compiler, grammar, bundled_tokenizer, text), text
    assert not _accepts(compiler, grammar, bundled_tokenizer, "Sure, " + good)


def test_forced_grammar_needs_a_tool():
    for parser in PARSERS:
        with pytest.raises(ValueError):
            parser.forced_grammar([], parallel=False)


def _call(name: str, arguments: dict):
    from services.gateway.openai.tools.types import ParsedToolCall

    return ParsedToolCall(name, json.dumps(arguments))

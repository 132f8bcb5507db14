"""Compiling a :class:`StructuredSpec` into an llguidance grammar bound to a tokenizer, cached by the spec's
key. The stable entry point for every layer (engine, nodes, gateway)::

    compiler = StructuredCompiler(tokenizer, vocab_size)   # services.engine.tokenizer.Tokenizer
    compiler.check(spec)     # raises InvalidRequestError("structured_output", "<what, and where>")
    compiled = compiler.compile(spec)                      # a CompiledGrammar (cached)

What each kind means:

- ``json_schema``: the schema as JSON Schema says, with OpenAI ``strict``'s closed objects (an object
  schema listing ``properties`` and silent about others allows no others; ``schema_tools.close_objects``),
  written compactly the way ``json.dumps`` does (``", "`` and ``": "``, no other whitespace: a model cannot
  pad an answer with endless whitespace). ``required`` is as written (OpenAI strict requires every property
  to be listed there; a schema that does not is served, not refused). A ``oneOf`` whose branches may
  overlap is refused (llguidance would approximate it with ``anyOf``, whose outputs may match two
  branches); disjoint ones are served. Options a schema's own ``x-guidance`` sets are overridden.
- ``json_object``: any JSON object, in the same compact form.
- ``regex``: the whole output matches it (Rust ``regex`` syntax, which llguidance takes).
- ``choice``: exactly one of the strings.
- ``grammar``: a Lark grammar as llguidance takes it (``start`` is the start rule).

A bad spec raises :class:`InvalidRequestError` naming the problem (with the JSON pointer of the failing
part of a schema); nothing is cached for it. The library's resource limits bound a compile (lexer fuel,
grammar size, lexer states) and a compile that still takes over ``COMPILE_LIMIT_S`` is refused.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import llguidance

from services.engine.errors import InvalidRequestError
from services.engine.structured.schema_tools import close_objects, locate_error, parse_schema
from services.engine.structured_spec import StructuredSpec
from services.engine.tokenizer import Tokenizer

FIELD = "structured_output"
CACHE_SIZE = 256
COMPILE_LIMIT_S = 5.0
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                "coerce_one_of": False, "lenient": False}
LIMITS = dict(max_items_in_row=2000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
              step_max_items=50_000, max_lexer_states=250_000, max_grammar_size=500_000, verbose_errors=False)


@dataclass(frozen=True)
class CompiledGrammar:
    """A spec compiled for one tokenizer. ``prototype`` is never advanced: each request's matcher is a
    copy (:meth:`new_matcher`), which shares the compiled grammar."""

    key: str
    grammar: str  # llguidance's grammar text
    prototype: llguidance.LLMatcher
    compile_s: float

    def new_matcher(self) -> llguidance.LLMatcher:
        return self.prototype.deep_copy()


class _Vocabulary:
    """The tokenizer as llguidance's ``TokenizerWrapper`` takes it: every token's bytes, and as special only
    the added tokens marked special. (``llguidance.hf.from_tokenizer`` makes EVERY added token special, so a
    grammar's text ``<tool_call>`` could never be written with Qwen's added, non-special ``<tool_call>`` token:
    the mask offered it and the matcher then refused it.)"""

    def __init__(self, tokenizer: Tokenizer):
        hf = tokenizer.hf
        self.eos_token_id = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        self.bos_token_id = hf.bos_token_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(len(hf))]
        self.special_token_ids = [i for i, token in hf.added_tokens_decoder.items() if token.special]
        self._hf = hf

    def __call__(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False))


class StructuredCompiler:
    """Compiles specs for ``tokenizer``'s vocabulary as the model sees it (``vocab_size``: the model's, which
    may exceed the tokenizer's; ids past the tokenizer are never allowed). Thread-safe."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, cache_size: int = CACHE_SIZE):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self.limits = llguidance.LLParserLimits(**LIMITS)
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built on first use (~0.4 s for a 49k vocabulary)."""
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_Vocabulary(self.tokenizer)), n_vocab=self.vocab_size,
                    eos_token=list(self.tokenizer.eos_token_ids))
            return self._ll_tokenizer

    def check(self, spec: StructuredSpec) -> None:
        """Raise :class:`InvalidRequestError` (field ``structured_output``) if ``spec`` does not compile, or
        its ``starts_after_token_ids`` are not tokens of the vocabulary."""
        outside = [after for after in spec.starts_after_token_ids if not 0 <= after < self.vocab_size]
        if outside:
            raise InvalidRequestError("structured_output", f"starts_after_token_ids {outside} are outside the "
                                                           f"vocabulary [0, {self.vocab_size})")
        self.compile(spec)

    def compile(self, spec: StructuredSpec) -> CompiledGrammar:
        """The compiled grammar of ``spec``, from the cache (LRU, ``cache_size`` entries) or compiled now."""
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = self._compile(spec, key)
        with self._lock:
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def cached(self, spec: StructuredSpec) -> bool:
        with self._lock:
            return spec.key in self._cache

    def _compile(self, spec: StructuredSpec, key: str) -> CompiledGrammar:
        spec.check_shape(FIELD)
        started = time.perf_counter()
        grammar = self._grammar_text(spec)
        ll_tokenizer = self.ll_tokenizer
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0, limits=self.limits)
        if not matcher.is_error():
            matcher.deep_copy().compute_bitmask()  # builds the first lexer state: limits hit now, not later
        if matcher.is_error():
            raise InvalidRequestError(FIELD, self._describe(spec, matcher.get_error()))
        elapsed = time.perf_counter() - started
        if elapsed > COMPILE_LIMIT_S:
            raise InvalidRequestError(FIELD, f"the {spec.kind} took {elapsed:.1f} s to compile, over the "
                                             f"limit of {COMPILE_LIMIT_S:.0f} s")
        return CompiledGrammar(key, grammar, matcher, elapsed)

    def _grammar_text(self, spec: StructuredSpec) -> str:
        make = llguidance.LLMatcher
        if spec.kind == "json_schema":
            schema, problem = parse_schema(spec.text)
            if schema is None:
                raise InvalidRequestError(FIELD, problem)
            return make.grammar_from_json_schema(close_objects(schema), overrides=JSON_OPTIONS)
        if spec.kind == "json_object":
            return make.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
        if spec.kind == "regex":
            return make.grammar_from_regex(spec.text)
        if spec.kind == "choice":
            # Lark string literals take JSON's escapes; ensure_ascii=False keeps astral characters whole
            return make.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False)
                                                                   for c in spec.choices))
        return make.grammar_from_lark(spec.text)

    def _describe(self, spec: StructuredSpec, error: str) -> str:
        error = error.strip()
        what = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex",
                "choice": "choice", "grammar": "grammar"}[spec.kind]
        if spec.kind != "json_schema":
            return f"invalid {what}: {error}"
        schema, _ = parse_schema(spec.text)
        assert schema is not None
        closed = close_objects(schema)
        where = locate_error(closed, self._schema_error(closed), self._schema_error)
        return f"invalid {what} at {where}: {error}"

    def _schema_error(self, schema: dict) -> str:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        return llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer, limits=self.limits)

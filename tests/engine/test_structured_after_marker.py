"""A constraint that starts after marker tokens (``StructuredSpec.starts_after_token_ids``: a reasoning model's
end of thinking, one token as Qwen3's ``</think>`` or a run as GPT-OSS's ``<|channel|>final<|message|>``): the
output is free until the marker, the grammar applies to what follows — on one engine, when the first token
comes from a prefill engine and a decode engine rebuilds the state, and for a run however the tokens reach the
state (one by one, or caught up in pieces that cut the run)."""

from __future__ import annotations

import re

import pytest

from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams
from services.engine.structured.matcher import RequestGrammar, check_tokens
from services.engine.structured_spec import StructuredSpec
from tests.engine.test_disaggregated_handoff import _run_disaggregated
from tests.engine.test_structured_output import _engine

REGEX = r"[0-9]{3}"


@pytest.fixture(scope="module")
def engine(family_dir):
    return _engine(family_dir("llama3"))


def _tokens(engine) -> tuple[int, int]:
    """A word token the regex never allows, and a marker token (neither is a digit)."""
    word, marker = engine.tokenizer.encode(" hello")[0], engine.tokenizer.encode(" think")[0]
    assert word != marker
    return word, marker


def test_before_the_marker_every_token_is_free(engine):
    word, marker = _tokens(engine)
    spec = StructuredSpec("regex", REGEX, starts_after_token_ids=(marker,))
    result = engine.generate([engine.tokenizer.encode("Count:")],
                             SamplingParams(max_tokens=6, temperature=1.0, seed=1, structured=spec,
                                            logit_bias=((word, 100.0),)))[0]
    assert result.token_ids == [word] * 6 and result.finish_reason == "length"


def test_after_the_marker_the_grammar_applies(engine):
    word, marker = _tokens(engine)
    spec = StructuredSpec("regex", REGEX, starts_after_token_ids=(marker,))
    sampling = [SamplingParams(max_tokens=30, temperature=1.2, seed=i, structured=spec,
                               logit_bias=((marker, 100.0), (word, 50.0))) for i in range(4)]
    for result in engine.generate([engine.tokenizer.encode(f"Count {i}:") for i in range(4)], sampling):
        assert result.token_ids[0] == marker, result.token_ids  # the biggest bias, while free
        assert result.finish_reason == "stop"
        assert re.fullmatch(REGEX, engine.tokenizer.decode(result.token_ids[1:])), result.text
    engine.check_integrity()


def test_a_decode_engine_rebuilds_the_state_from_the_prefill_engines_tokens(engine, family_dir):
    word, marker = _tokens(engine)
    spec = StructuredSpec("regex", REGEX, starts_after_token_ids=(marker,))
    prompts = {f"r{i}": engine.tokenizer.encode(f"Count {i}:") for i in range(3)}
    for bias, first in (((marker, 100.0), marker), ((word, 100.0), word)):  # marker first / free first
        sampling = SamplingParams(max_tokens=12, temperature=0.0, structured=spec, logit_bias=(bias,))
        expected = [r.token_ids for r in engine.generate(list(prompts.values()), sampling)]
        prefill, decode = _engine(family_dir("llama3")), _engine(family_dir("llama3"))
        handed = _run_disaggregated(prefill, decode, prompts, sampling)
        assert [r.output_token_ids for r in handed.values()] == expected
        assert all(ids[0] == first for ids in expected)


def test_a_marker_outside_the_vocabulary_is_refused(engine):
    spec = StructuredSpec("regex", REGEX, starts_after_token_ids=(5, 10**7))
    with pytest.raises(InvalidRequestError, match=r"starts_after_token_ids \[10000000\]"):
        engine.add_request(sampling=SamplingParams(max_tokens=4, structured=spec), token_ids=[5, 6])
    assert not engine.has_unfinished()


def _run_marker(engine) -> tuple[int, int, list[int], list[int]]:
    """Two marker tokens, a free output that holds them apart and reversed, and digits' tokens."""
    word, first = _tokens(engine)
    second = engine.tokenizer.encode(" final")[0]
    digits = engine.tokenizer.encode("123")
    return first, second, [word, first, word, second, second, first, word], digits


def test_a_run_of_marker_tokens_starts_the_grammar_only_when_whole(engine):
    first, second, free, digits = _run_marker(engine)
    compiled = engine.structured.compile(StructuredSpec("regex", REGEX))
    one_by_one = RequestGrammar(compiled, (first, second))
    for token in free:  # each marker alone, and the two in the other order, leave the output free
        assert one_by_one.advance(token) and not one_by_one.active
    assert one_by_one.advance(first) and not one_by_one.active
    assert one_by_one.advance(second) and one_by_one.active  # the run just came whole
    output = [*free, first, second, *digits]
    for token in digits:
        assert one_by_one.advance(token)
    assert one_by_one.complete
    for cut in range(len(free), len(output) + 1):  # caught up in two pieces, cut anywhere around the run
        caught_up = RequestGrammar(compiled, (first, second))
        assert caught_up.sync(output[:cut]) and caught_up.sync(output)
        assert caught_up.active and caught_up.complete, cut
    refused = RequestGrammar(compiled, (first, second))
    assert not refused.sync([*free, first, second, free[0]])  # a word where the grammar wants a digit
    check_tokens(compiled, output, "structured_output", (first, second))
    check_tokens(compiled, [*free, first], "structured_output", (first, second))  # the grammar not started
    with pytest.raises(InvalidRequestError, match="structured_output"):
        check_tokens(compiled, [first, second, free[0]], "structured_output", (first, second))

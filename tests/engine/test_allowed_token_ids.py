"""vLLM's ``allowed_token_ids`` on the real model: only the listed ids are sampled, greedy or random; where
the model's own choice is listed it is kept; with a structured output both must allow an id; an id outside
the vocabulary is refused naming the field."""

from __future__ import annotations

import pytest

from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams
from services.engine.structured_spec import StructuredSpec
from tests.conftest import make_engine

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine(fp32_model, bundled_tokenizer):
    return make_engine(fp32_model, bundled_tokenizer)


def test_only_the_listed_ids_are_sampled(engine, bundled_tokenizer):
    (free,) = engine.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    listed = tuple(bundled_tokenizer.encode(" one two three four five"))
    assert free.token_ids[0] not in listed
    greedy, seeded = engine.generate([PROMPT, PROMPT], [
        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, allowed_token_ids=listed),
        SamplingParams(max_tokens=6, temperature=1.5, seed=3, ignore_eos=True, allowed_token_ids=listed)])
    assert set(greedy.token_ids) <= set(listed) and set(seeded.token_ids) <= set(listed)
    # the model's own first choice, listed with others: it is kept (the mask changes nothing else)
    (kept,) = engine.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True,
                                                       allowed_token_ids=(*listed, free.token_ids[0])))
    assert kept.token_ids == free.token_ids[:1]
    engine.check_integrity()


def test_with_a_structured_output_both_must_allow_an_id(engine, bundled_tokenizer):
    regex = StructuredSpec("regex", "[0-9]{4}")
    (free,) = engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, structured=regex))
    others = [d for d in "0123456789" if d != free.text[0]]  # the grammar's own first digit is not listed
    listed = tuple(bundled_tokenizer.hf.convert_tokens_to_ids(others))
    (done,) = engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, structured=regex,
                                                       allowed_token_ids=listed))
    assert len(done.text) == 4 and set(done.text) <= set(others), (free.text, done.text)
    engine.check_integrity()


def test_an_id_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(InvalidRequestError, match="allowed_token_ids"):
        engine.add_request(PROMPT, SamplingParams(max_tokens=1, allowed_token_ids=(1, 10**9)))
    engine.check_integrity()


def test_a_grammar_that_allows_none_of_them_ends_the_request_saying_so(engine, bundled_tokenizer):
    digits = tuple(bundled_tokenizer.hf.convert_tokens_to_ids(list("0123456789")))
    request = engine.add_request(PROMPT, SamplingParams(max_tokens=8, temperature=0, allowed_token_ids=digits,
                                                        structured=StructuredSpec("regex", "[a-z]{3}")))
    outputs = []
    while engine.has_unfinished():
        outputs += [out for out in engine.step() if out.request_id == request.request_id]
    assert outputs[-1].finish_reason == "abort"
    assert "allows none of allowed_token_ids" in outputs[-1].abort_reason
    engine.check_integrity()

"""Logprobs of generated tokens on the real model (float32): the model's own distribution at each step, as
transformers computes it on the same GGUF; the k most likely tokens, most likely first; the same whether a
request shares its batch or not, and unchanged by sampling settings."""

from __future__ import annotations

import math

import pytest
import torch

from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def engine(fp32_model, bundled_tokenizer):
    return make_engine(fp32_model, bundled_tokenizer)


@pytest.fixture(scope="module")
def greedy(engine):
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=5)
    return engine.generate([PROMPT], params)[0]


def test_each_token_has_its_logprob_and_the_k_most_likely_most_likely_first(greedy):
    assert [lp.token_id for lp in greedy.logprobs] == greedy.token_ids
    for lp in greedy.logprobs:
        assert len(lp.top) == 5
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert lp.top[0] == (lp.token_id, pytest.approx(lp.logprob))  # greedy took the most likely
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5


def test_logprobs_equal_transformers_log_softmax_on_the_same_file(greedy, hf_bundled_model):
    model = hf_bundled_model
    ids = greedy.prompt_token_ids + greedy.token_ids
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    start = len(greedy.prompt_token_ids) - 1  # the position whose logits sampled the first new token
    for i, lp in enumerate(greedy.logprobs):
        assert lp.logprob == pytest.approx(float(reference[start + i, lp.token_id]), abs=2e-3)
        top_ids = reference[start + i].topk(5).indices.tolist()
        assert [t for t, _ in lp.top] == top_ids


def test_logprobs_are_the_model_s_whatever_the_sampling_and_the_batch(engine, greedy):
    """Raw logprobs (vLLM's default): temperature, top-k and other requests in the batch change nothing."""
    seeded = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.7, top_k=3, seed=11, ignore_eos=True, logprobs=0)
    other = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    sampled, plain, again = engine.generate([PROMPT, "Once upon a time", PROMPT],
                                            [seeded, other, SamplingParams(**{**greedy_params(), "logprobs": 2})])
    assert plain.logprobs == [] and all(lp.top == () for lp in sampled.logprobs)
    assert [lp.token_id for lp in sampled.logprobs] == sampled.token_ids
    assert [lp.logprob for lp in again.logprobs] == pytest.approx([lp.logprob for lp in greedy.logprobs], abs=1e-4)
    first_top = dict(greedy.logprobs[0].top)  # top_k=3 samples among the 3 most likely: within these 5
    assert sampled.logprobs[0].logprob == pytest.approx(first_top[sampled.token_ids[0]], abs=1e-4)


def greedy_params() -> dict:
    return {"max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("k", [-1, 21])
def test_more_than_20_alternatives_or_a_negative_count_is_refused(engine, k):
    with pytest.raises(InvalidRequestError, match="logprobs"):
        engine.add_request(PROMPT, SamplingParams(max_tokens=2, logprobs=k))
    engine.check_integrity()

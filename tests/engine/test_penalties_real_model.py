"""Presence, frequency and repetition penalties and min_p on the real model: each penalty breaks the greedy
loop the bundled model falls into; penalized requests give the same tokens whether or not they were
preempted and recomputed (the penalties read the whole history, not the blocks); logprobs stay those of
the raw distribution."""

from __future__ import annotations

import pytest

from services.engine.admission import AdmissionConfig
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.engine.prompts import STORY

pytestmark = pytest.mark.slow

LOOPING = "Once upon a time, there was a little cat. The cat"  # greedy: "... He had a baby. He had a baby. ..."


def _greedy(**penalty) -> SamplingParams:
    return SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, **penalty)


def test_each_penalty_breaks_the_greedy_loop(fp32_model, bundled_tokenizer):
    penalties = [{}, {"repetition_penalty": 1.3}, {"frequency_penalty": 1.0}, {"presence_penalty": 1.5}]
    results = make_engine(fp32_model, bundled_tokenizer).generate([LOOPING] * 4, [_greedy(**p) for p in penalties])
    plain = results[0].token_ids
    assert len(set(plain)) < 15, bundled_tokenizer.decode(plain)  # the loop this test is about
    for penalty, result in zip(penalties[1:], results[1:], strict=True):
        assert len(set(result.token_ids)) >= len(set(plain)) + 15, (penalty, bundled_tokenizer.decode(result.token_ids))
    # presence and frequency count the output only: the first token is greedy's (3 tokens: no repeat yet)
    assert results[2].token_ids[:3] == results[3].token_ids[:3] == plain[:3]


def test_penalized_requests_give_the_same_tokens_when_preempted_and_recomputed(fp32_model, bundled_tokenizer):
    words = STORY.split()
    prompts = [bundled_tokenizer.encode(f"Story {i}: " + " ".join(words[i * 9:i * 9 + 20])) for i in range(6)]
    params = [SamplingParams(max_tokens=32, ignore_eos=True, seed=100 + i, temperature=0.0 if i % 2 else 0.8,
                             repetition_penalty=1.0 + 0.1 * (i % 3), frequency_penalty=0.3 * (i % 4),
                             presence_penalty=-0.5 if i == 5 else 0.4, min_p=0.05 * (i % 3))
              for i in range(len(prompts))]
    want = [r.token_ids for r in make_engine(fp32_model, bundled_tokenizer).generate(prompts, params)]
    pressed = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=10, admission=AdmissionConfig(policy="none"),
                          offload_host_gib=0)  # every victim recomputed
    assert [r.token_ids for r in pressed.generate(prompts, params)] == want
    assert pressed.scheduler.stats.recomputes_total > 0
    assert pressed.kv.num_free_blocks == pressed.kv.num_blocks
    pressed.check_integrity()


def test_logprobs_are_the_raw_distribution_s(fp32_model, bundled_tokenizer):
    engine = make_engine(fp32_model, bundled_tokenizer)
    prompt = bundled_tokenizer.encode(LOOPING)
    plain, penalized = (engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, logprobs=20, **p))[0]
                        for p in ({}, {"repetition_penalty": 3.0}))
    assert penalized.token_ids != plain.token_ids  # the penalty chose another token ...
    assert penalized.logprobs[0].top == plain.logprobs[0].top  # ... from the same reported distribution
    raw = dict(plain.logprobs[0].top)
    assert penalized.token_ids[0] in raw and penalized.logprobs[0].logprob == raw[penalized.token_ids[0]]

"""Greedy outputs through gateway → prefill node → decode node equal the mixed engine's, token for token,
for prompts from 1 to 800+ tokens, 16 at once; cached_tokens counts a repeated prefix; nothing leaks."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from pdserve.v1 import gateway_pb2

from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.e2e.conftest import generate, greedy, wait_idle
from tests.engine.prompts import SYSTEM, long_text

pytestmark = pytest.mark.slow
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def prompts(bundled_tokenizer):
    tok = bundled_tokenizer
    book = tok.encode(long_text(13))
    assert len(book) > 800
    ids = [tok.encode("Hello")[:1], tok.encode("The capital of France is"), book,
           tok.encode(long_text(13) + " Who made the clocks?"), tok.encode(long_text(2)),
           tok.encode(SYSTEM * 3 + " When does the first train leave?")]
    ids += [tok.encode(f"Question {i}: what is {i} plus {i * 3}? Answer:") for i in range(6)]
    ids += [tok.encode(long_text(1 + i % 4) + f" Part {i}.") for i in range(4)]
    assert len(ids) == 16
    return ids


@pytest.fixture(scope="module")
def expected(fp32_model, bundled_tokenizer, prompts):
    engine = make_engine(fp32_model, bundled_tokenizer)
    results = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    return [r.token_ids for r in results]


def test_sixteen_concurrent_requests_match_the_mixed_engine(stub, prompts, expected):
    def run(ids):
        return generate(stub, token_ids=ids, sampling=greedy(NEW_TOKENS))

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, prompts))
    for ids, want, (tokens, _text, last) in zip(prompts, expected, results, strict=True):
        assert tokens == want, f"prompt of {len(ids)} tokens"
        assert last.finish_reason == "length"
        assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(ids), NEW_TOKENS)
    wait_idle(stub)


def test_repeated_prefix_is_counted_in_cached_tokens(stub, bundled_tokenizer):
    prompt = long_text(5) + " The end."
    first_tokens, first_text, _ = generate(stub, prompt=prompt, sampling=greedy(8))
    tokens, text, last = generate(stub, prompt=prompt, sampling=greedy(8))
    n = len(bundled_tokenizer.encode(prompt))
    assert last.usage.cached_tokens == (n - 1) // 16 * 16 > 0
    assert (tokens, text) == (first_tokens, first_text)
    wait_idle(stub)


def test_logprobs_through_the_cluster_equal_the_mixed_engine_s(stub, fp32_model, bundled_tokenizer):
    """The first token's logprob comes from the prefill node, the rest from the decode node: both equal
    what the mixed engine computes for the same prompt (float32), alternatives included."""
    prompt = "The capital of France is"
    engine = make_engine(fp32_model, bundled_tokenizer)
    want = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3))[0]
    logprobs = []
    for response in stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, sampling=greedy(6, logprobs=3)),
                                  timeout=120):
        assert len(response.logprobs) == len(response.token_ids)
        logprobs += response.logprobs
    assert [lp.token_id for lp in logprobs] == want.token_ids
    for got, expected in zip(logprobs, want.logprobs, strict=True):
        assert got.logprob == pytest.approx(expected.logprob, abs=1e-4)
        assert [(t.token_id, pytest.approx(t.logprob, abs=1e-4)) for t in got.top] == list(expected.top)
    plain = list(stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, sampling=greedy(3)), timeout=120))
    assert all(not response.logprobs for response in plain)
    wait_idle(stub)


def test_penalties_min_p_and_logit_bias_through_the_cluster_equal_the_mixed_engine_s(stub, fp32_model,
                                                                                   bundled_tokenizer):
    """The prefill node samples the first token (the repetition penalty reads the prompt), the decode node
    the rest (every penalty reads the output so far): both as the mixed engine, greedy and seeded; a
    banned token stays banned on both."""
    prompt = "Once upon a time, there was a little cat. The cat"
    settings = [dict(repetition_penalty=1.3), dict(frequency_penalty=1.0, presence_penalty=0.5),
                dict(presence_penalty=-1.0, repetition_penalty=0.9),
                dict(temperature=0.8, seed=7, min_p=0.1, frequency_penalty=0.4)]
    was, had = (bundled_tokenizer.encode(word)[0] for word in (" was", " had"))
    settings.insert(0, dict(logit_bias={was: -100.0, had: 3.5}))  # greedy: " was named Spark. ... He had a baby"
    engine = make_engine(fp32_model, bundled_tokenizer)
    for extra in settings:
        params = {"temperature": 0.0, **extra}
        engine_params = {**params, "logit_bias": tuple(params.get("logit_bias", {}).items())}
        want = engine.generate([prompt], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, **engine_params))[0]
        tokens, text, _ = generate(stub, prompt=prompt, sampling=gateway_pb2.SamplingParams(
            max_tokens=NEW_TOKENS, ignore_eos=True, **params))
        assert (tokens, text) == (want.token_ids, want.text), extra
    seeded = dict(settings[-1], min_p=0.0)
    without_min_p = engine.generate([prompt], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, **seeded))[0]
    assert without_min_p.token_ids != want.token_ids  # the same seed without min_p draws other tokens
    wait_idle(stub)

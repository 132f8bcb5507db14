"""Memory pressure on the real model: a pool far too small for 32 requests forces preemptions; the victims'
KV is copied out (host memory, then the cache-store) and back, so outputs match an unconstrained pool
token for token, nothing is recomputed, and every block and every offloaded byte comes back."""

from __future__ import annotations

import random

import pytest

from services.engine.admission import AdmissionConfig
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.engine.prompts import STORY

pytestmark = pytest.mark.slow

NONE = AdmissionConfig(policy="none")  # admit whenever the prompt fits: preemption has to sort it out


def _workload(tokenizer, n: int = 32):
    rng = random.Random(4)
    words = STORY.split()
    prompts, params = [], []
    for i in range(n):
        start = rng.randrange(len(words) - 40)
        text = f"Request {i}: " + " ".join(words[start:start + rng.randrange(3, 40)])
        prompts.append(tokenizer.encode(text))
        params.append(SamplingParams(max_tokens=rng.randrange(8, 41), temperature=0.0, ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def workload(bundled_tokenizer):
    return _workload(bundled_tokenizer)


@pytest.fixture(scope="module")
def expected(fp32_model, bundled_tokenizer, workload):
    unconstrained = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=512)
    results = unconstrained.generate(*workload)
    assert unconstrained.scheduler.stats.preemptions_total == 0
    return [r.token_ids for r in results]


def _run(engine, workload):
    results = engine.generate(*workload)
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks, "blocks leaked"
    assert engine.offload.host_bytes_used == 0 and not engine.offload._copies, "offloaded KV leaked"
    return [r.token_ids for r in results]


def test_preempted_kv_is_kept_in_host_memory_and_resumed_without_recompute(fp32_model, bundled_tokenizer,
                                                                         workload, expected):
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=64, admission=NONE)
    assert _run(engine, workload) == expected
    stats = engine.scheduler.stats
    assert stats.preemptions_total > 0
    assert stats.offloads_total == stats.preemptions_total == stats.resumes_total
    assert stats.recomputes_total == 0
    assert engine.offload.stats.offloaded_bytes_total > 0
    assert engine.offload.stats.restored_bytes_total <= engine.offload.stats.offloaded_bytes_total


def test_without_a_host_budget_victims_are_recomputed_with_the_same_outputs(fp32_model, bundled_tokenizer,
                                                                            workload, expected):
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=64, admission=NONE, offload_host_gib=0)
    assert _run(engine, workload) == expected
    stats = engine.scheduler.stats
    assert stats.preemptions_total > 0 and stats.recomputes_total == stats.preemptions_total
    assert stats.offloads_total == stats.resumes_total == 0


def test_the_default_policy_preempts_less_than_no_reservation(fp32_model, bundled_tokenizer, workload, expected):
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=64)
    assert _run(engine, workload) == expected
    none = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=64, admission=NONE)
    _run(none, workload)
    assert engine.scheduler.stats.preemptions_total < none.scheduler.stats.preemptions_total

"""Prefix-hit counters are exact on a scripted workload: shared prefixes, a repeated prompt and requests
preempted (kept or recomputed) — each request counted once, at its first admission."""

from __future__ import annotations

import pytest

from services.engine.admission import AdmissionConfig
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine

pytestmark = pytest.mark.slow

SHARED = list(range(500, 532))  # exactly 2 blocks of 16


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("offload_host_gib", [1.0, 0.0], ids=["kv-kept", "recomputed"])
def test_hit_counts_are_exact_and_a_preempted_request_counts_once(fp32_model, bundled_tokenizer, offload_host_gib):
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=12, admission=AdmissionConfig(policy="none"),
                         offload_host_gib=offload_host_gib)
    a, b = [*SHARED, *range(600, 610)], [*SHARED, *range(700, 712)]
    for prompt in (a, b, a):  # one at a time: 0, then 32 (shared), then 32 (a's full blocks: max 41 // 16 = 2)
        engine.generate([prompt], _greedy(4))
    long1, long2 = list(range(2000, 2040)), list(range(3000, 3040))  # 7 blocks each by the end: 14 > 12
    engine.generate([long1, long2], _greedy(60))
    stats = engine.scheduler.stats
    assert stats.preemptions_total > 0
    assert (stats.requests_admitted_total, stats.prompt_tokens_total) == (5, 42 + 44 + 42 + 40 + 40)
    assert (stats.prefix_hit_tokens_total, stats.prefix_hit_requests_total) == (64, 2)
    engine.check_integrity()

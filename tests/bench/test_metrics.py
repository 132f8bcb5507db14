"""Benchmark metrics: the stream timer's TTFT/ITL, TPOT, percentiles, throughput and goodput."""

from __future__ import annotations

import numpy as np
import pytest

from services.bench.metrics import Distribution, compute_metrics, median_metrics, meets_slos, parse_slos
from services.bench.outcome import RequestOutcome, StreamTimer


def outcome(ttft: float, latency: float, tokens: int, prompt: int = 10, ok: bool = True,
            itl: list[float] | None = None) -> RequestOutcome:
    return RequestOutcome(ok=ok, prompt_len=prompt, output_tokens=tokens, ttft_s=ttft, latency_s=latency,
                          itl_s=itl or [], error="" if ok else "boom")


def test_stream_timer_spreads_a_message_over_its_tokens():
    timer = StreamTimer()
    t0 = timer.start
    timer.arrived(0, now=t0 + 0.05)  # a message without tokens changes nothing
    timer.arrived(2, now=t0 + 0.100)  # first message: TTFT, its second token adds a gap of 0
    timer.arrived(1, now=t0 + 0.130)
    timer.arrived(3, now=t0 + 0.190)  # 60 ms over three tokens
    assert timer.ttft_s == pytest.approx(0.100)
    assert timer.itl_s == pytest.approx([0.0, 0.030, 0.020, 0.020, 0.020])
    assert len(timer.itl_s) == timer.tokens - 1 == 5
    assert timer.ttft_s + sum(timer.itl_s) == pytest.approx(0.190)
    done = timer.outcome(prompt_len=7)
    assert done.ok and done.output_tokens == 6 and done.latency_s >= 0.0
    failed = timer.outcome(prompt_len=7, output_tokens=2, error="UNAVAILABLE")
    assert not failed.ok and failed.output_tokens == 2


def test_tpot_excludes_the_first_token():
    assert outcome(0.2, 1.2, 11).tpot_s == pytest.approx(0.1)
    assert outcome(0.2, 0.2, 1).tpot_s is None
    assert outcome(0.2, 0.2, 0).tpot_s is None


def test_distribution_matches_numpy_percentiles():
    values = [float(v) for v in range(1, 101)]
    d = Distribution.of(values)
    assert d.mean == pytest.approx(50.5)
    assert d.median == pytest.approx(50.5)
    assert d.p90 == pytest.approx(np.percentile(values, 90)) == pytest.approx(90.1)
    assert d.p99 == pytest.approx(99.01)
    assert d.std == pytest.approx(np.std(values))
    assert Distribution.of([]) == Distribution()


def test_compute_metrics_counts_only_completed_requests():
    outcomes = [
        outcome(0.1, 1.1, 11, prompt=100, itl=[0.1] * 10),
        outcome(0.3, 2.3, 21, prompt=200, itl=[0.1] * 20),
        outcome(0.0, 0.5, 3, prompt=50, ok=False),
    ]
    m = compute_metrics(outcomes, duration_s=4.0)
    assert (m.completed, m.failed) == (2, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (300, 32)
    assert m.request_throughput == pytest.approx(0.5)
    assert m.output_throughput == pytest.approx(8.0)
    assert m.input_throughput == pytest.approx(75.0)
    assert m.total_token_throughput == pytest.approx(83.0)
    assert m.ttft_ms.mean == pytest.approx(200.0)
    assert m.tpot_ms.mean == pytest.approx(100.0)
    assert m.itl_ms.median == pytest.approx(100.0)
    assert m.e2el_ms.median == pytest.approx(1700.0)
    assert m.goodput is None


def test_goodput_counts_requests_meeting_every_slo():
    slos = parse_slos(["ttft:200", "tpot:50"])
    assert slos == {"ttft": 200.0, "tpot": 50.0}
    fast = outcome(0.1, 0.5, 11)  # TTFT 100 ms, TPOT 40 ms
    slow_first = outcome(0.3, 0.5, 11)  # TTFT 300 ms
    slow_tokens = outcome(0.1, 1.1, 11)  # TPOT 100 ms
    single = outcome(0.15, 0.15, 1)  # no TPOT: meets the TPOT SLO
    failed = outcome(0.01, 0.02, 11, ok=False)
    assert [meets_slos(o, slos) for o in (fast, slow_first, slow_tokens, single, failed)] == [
        True, False, False, True, False]
    m = compute_metrics([fast, slow_first, slow_tokens, single, failed], duration_s=2.0, slos=slos)
    assert m.goodput == pytest.approx(1.0)
    assert compute_metrics([fast], 1.0, {"e2el": 400}).goodput == 0.0
    for bad in (["ttft"], ["speed:5"], ["ttft:-1"], ["tpot:"]):
        with pytest.raises(ValueError):
            parse_slos(bad)


def test_median_over_rounds_is_field_by_field():
    runs = [compute_metrics([outcome(t, t + 1.0, 11)], duration_s=d) for t, d in ((0.1, 2.0), (0.3, 4.0), (0.2, 1.0))]
    median = median_metrics(runs)
    assert median["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert median["duration_s"] == pytest.approx(2.0)
    assert median["output_throughput"] == pytest.approx(5.5)
    assert median["goodput"] is None

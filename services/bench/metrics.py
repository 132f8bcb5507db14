"""Serving metrics of one run, with the definitions of ``vllm bench serve``.

- TTFT: request sent → first token received. E2E latency: request sent → last byte.
- TPOT: per request, (E2E − TTFT) / (output tokens − 1); requests with fewer than 2 tokens have none.
- ITL: every gap between consecutive tokens of every request (pooled).
- Throughput: totals over the run's duration (first request sent → last one finished); only completed
  requests count.
- Goodput: completed requests per second that met every SLO given (TTFT, TPOT, E2E, in ms).

Distributions are in milliseconds: mean, std, median (p50), p90, p99 (linear interpolation, numpy's
default), over completed requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from services.bench.outcome import RequestOutcome

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class Distribution:
    mean: float = 0.0
    std: float = 0.0
    median: float = 0.0
    p90: float = 0.0
    p99: float = 0.0

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> Distribution:
        if not len(values_ms):
            return cls()
        data = np.asarray(values_ms, dtype=np.float64)
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return cls(float(data.mean()), float(data.std()), float(p50), float(p90), float(p99))


@dataclass(frozen=True)
class BenchMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    input_throughput: float  # prompt tokens / s
    output_throughput: float  # generated tokens / s
    total_token_throughput: float
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    goodput: float | None  # requests / s meeting every SLO; None when no SLO was given
    peak_concurrency: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def parse_slos(items: Sequence[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` → ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in SLO_METRICS or not value:
            raise ValueError(f"bad SLO {item!r}: expected NAME:MS with NAME one of {', '.join(SLO_METRICS)}")
        if float(value) <= 0:
            raise ValueError(f"bad SLO {item!r}: the limit must be positive")
        slos[name] = float(value)
    return slos


def meets_slos(outcome: RequestOutcome, slos: Mapping[str, float]) -> bool:
    """Whether a completed request met every SLO. A request with one token has no TPOT and meets a
    TPOT SLO trivially."""
    if not outcome.ok:
        return False
    values = {"ttft": outcome.ttft_s * 1000, "e2el": outcome.latency_s * 1000}
    if outcome.tpot_s is not None:
        values["tpot"] = outcome.tpot_s * 1000
    return all(values.get(name, 0.0) <= limit for name, limit in slos.items())


def compute_metrics(outcomes: Sequence[RequestOutcome], duration_s: float, slos: Mapping[str, float] | None = None,
                    peak_concurrency: int = 0) -> BenchMetrics:
    done = [o for o in outcomes if o.ok]
    duration_s = max(duration_s, 1e-9)
    total_in = sum(o.prompt_len for o in done)
    total_out = sum(o.output_tokens for o in done)
    goodput = None
    if slos:
        goodput = sum(meets_slos(o, slos) for o in done) / duration_s
    return BenchMetrics(
        completed=len(done), failed=len(outcomes) - len(done), duration_s=duration_s,
        total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=len(done) / duration_s, input_throughput=total_in / duration_s,
        output_throughput=total_out / duration_s, total_token_throughput=(total_in + total_out) / duration_s,
        ttft_ms=Distribution.of([o.ttft_s * 1000 for o in done]),
        tpot_ms=Distribution.of([o.tpot_s * 1000 for o in done if o.tpot_s is not None]),
        itl_ms=Distribution.of([gap * 1000 for o in done for gap in o.itl_s]),
        e2el_ms=Distribution.of([o.latency_s * 1000 for o in done]),
        goodput=goodput, peak_concurrency=peak_concurrency)


def median_metrics(runs: Sequence[BenchMetrics]) -> dict:
    """Each numeric field's median over several runs (nested distributions field by field)."""
    dicts = [r.to_dict() for r in runs]

    def merge(values: list) -> object:
        if isinstance(values[0], dict):
            return {key: merge([v[key] for v in values]) for key in values[0]}
        if any(v is None for v in values):
            return None
        return float(np.median(values))

    return merge(dicts)  # type: ignore[return-value]

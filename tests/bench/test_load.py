"""The load loop: the seeded Poisson schedule, the concurrency cap, send times, failed requests."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from services.bench.datasets import BenchRequest
from services.bench.load import LoadSpec, arrival_offsets, run_load
from services.bench.outcome import RequestOutcome


def requests(count: int) -> list[BenchRequest]:
    return [BenchRequest(prompt=f" w{i}", prompt_ids=(i,), output_len=4) for i in range(count)]


def test_poisson_schedule_is_seeded_with_the_asked_rate():
    offsets = arrival_offsets(5000, request_rate=20.0, seed=7)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    assert gaps.std() == pytest.approx(1 / 20, rel=0.08)  # exponential: std = mean
    assert arrival_offsets(50, 20.0, seed=7) == offsets[:50]
    assert arrival_offsets(50, 20.0, seed=8) != offsets[:50]
    assert arrival_offsets(4, math.inf, seed=7) == [0.0] * 4
    with pytest.raises(ValueError):
        arrival_offsets(4, 0.0, seed=7)


async def test_max_concurrency_caps_requests_in_flight():
    in_flight = peak = 0

    async def send(request: BenchRequest) -> RequestOutcome:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return RequestOutcome(ok=True, prompt_len=1, output_tokens=request.prompt_ids[0])

    result = await run_load(requests(20), send, LoadSpec(max_concurrency=3, progress=False))
    assert peak == 3 and result.peak_concurrency == 3
    assert [o.output_tokens for o in result.outcomes] == list(range(20))  # the workload's order
    assert result.duration_s >= 0.06  # 20 requests of 10 ms, 3 at a time: at least 7 waves


async def test_requests_are_sent_on_their_schedule_and_failures_are_kept():
    sent: list[float] = []

    async def send(request: BenchRequest) -> RequestOutcome:
        sent.append(time.perf_counter())
        ok = request.prompt_ids[0] != 2
        return RequestOutcome(ok=ok, prompt_len=1, error="" if ok else "refused")

    started = time.perf_counter()
    result = await run_load(requests(6), send, LoadSpec(request_rate=25.0, seed=1, progress=False))
    offsets = arrival_offsets(6, 25.0, seed=1)
    for at, offset in zip(sent, offsets, strict=True):
        assert at - started == pytest.approx(offset, abs=0.03)
    assert [o.ok for o in result.outcomes] == [True, True, False, True, True, True]
    assert result.duration_s >= offsets[-1]

"""The load loop: send a workload's requests on a Poisson schedule and/or under a concurrency cap.

``request_rate = inf`` sends every request at once (then only ``max_concurrency`` limits what is in
flight), a finite rate draws exponential gaps with that mean rate (seeded, so runs are repeatable).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tqdm.asyncio import tqdm

from services.bench.datasets import BenchRequest
from services.bench.outcome import RequestOutcome


@dataclass(frozen=True)
class LoadSpec:
    request_rate: float = math.inf  # requests per second; inf = all at once
    max_concurrency: int | None = None  # None = no cap
    seed: int = 0
    progress: bool = True


@dataclass(frozen=True)
class LoadResult:
    outcomes: list[RequestOutcome]  # in the workload's order
    duration_s: float  # first request sent → last request finished
    peak_concurrency: int


def arrival_offsets(count: int, request_rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent: cumulative exponential gaps of mean
    ``1 / request_rate`` (the first request at 0), all zeros for an infinite rate."""
    if request_rate <= 0:
        raise ValueError(f"request_rate must be positive, got {request_rate}")
    if math.isinf(request_rate):
        return [0.0] * count
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for i in range(count):
        if i:
            now += rng.expovariate(request_rate)
        offsets.append(now)
    return offsets


async def run_load(requests: Sequence[BenchRequest], send: Callable[[BenchRequest], Awaitable[RequestOutcome]],
                   spec: LoadSpec, description: str = "") -> LoadResult:
    """Send every request through ``send``; returns once all have finished (failed ones included)."""
    offsets = arrival_offsets(len(requests), spec.request_rate, spec.seed)
    limit = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    in_flight = peak = 0
    bar = tqdm(total=len(requests), desc=description or None, disable=not spec.progress, leave=False)

    async def one(request: BenchRequest, offset: float) -> RequestOutcome:
        nonlocal in_flight, peak
        delay = started + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if limit is not None:
            await limit.acquire()
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await send(request)
        finally:
            in_flight -= 1
            if limit is not None:
                limit.release()
            bar.update(1)

    started = time.perf_counter()
    try:
        outcomes = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets, strict=True)))
    finally:
        bar.close()
    return LoadResult(list(outcomes), time.perf_counter() - started, peak)

"""The node's periodic ``engine stats`` log line, like vLLM's: requests running and waiting, KV usage, the
prefix-cache hit rate, and prompt and generation throughput since the last line. Written every
``--stats-log-interval-s`` while the node has work (or had some since the last line), so an idle node's log
stays quiet."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from services.engine.stats import EngineStats

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class StatsSample:
    at: float  # time.monotonic()
    stats: EngineStats


def stats_line(previous: StatsSample, current: StatsSample) -> dict[str, object] | None:
    """The fields of the line from ``previous`` to ``current``; None when nothing ran in between and
    nothing is running or waiting now."""
    before, now = previous.stats, current.stats
    prompt = now.prompt_tokens_total - before.prompt_tokens_total
    generated = now.generated_tokens_total - before.generated_tokens_total
    if not (prompt or generated or now.requests_running or now.requests_waiting):
        return None
    elapsed = max(current.at - previous.at, 1e-9)
    used = now.blocks_total - now.blocks_free - now.blocks_cached
    hits = now.prefix_hit_tokens_total - before.prefix_hit_tokens_total
    return {"running": now.requests_running, "waiting": now.requests_waiting,
            "kv_usage_pct": round(100 * used / max(now.blocks_total, 1), 1),
            "prompt_tokens_per_s": round(prompt / elapsed, 1), "generation_tokens_per_s": round(generated / elapsed, 1),
            "prefix_hit_pct": round(100 * hits / prompt, 1) if prompt else None,
            "preemptions": now.preemptions_total - before.preemptions_total}


async def log_stats(sample: Callable[[], Awaitable[EngineStats]], interval_s: float) -> None:
    """Log a line every ``interval_s`` until cancelled; a failed sample (the engine stopping) ends it."""
    previous = StatsSample(time.monotonic(), await sample())
    while True:
        await asyncio.sleep(interval_s)
        try:
            current = StatsSample(time.monotonic(), await sample())
        except Exception:  # the engine stopped or failed: its own paths report that
            return
        fields = stats_line(previous, current)
        if fields is not None:
            log.info("engine stats", **fields)
        previous = current


@contextlib.asynccontextmanager
async def periodic_stats(sample: Callable[[], Awaitable[EngineStats]], interval_s: float):
    """:func:`log_stats` in the background while the block runs (nothing when ``interval_s`` is 0)."""
    task = asyncio.ensure_future(log_stats(sample, interval_s)) if interval_s > 0 else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

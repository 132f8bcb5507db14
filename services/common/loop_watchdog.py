"""Notices when this process's event loop did not run for a while.

A process that was paused (SIGSTOP, a frozen container), starved of CPU, or held by a callback that blocked
the loop stops answering its peers' keepalive pings and its own; when it runs again, calls to healthy peers
fail with ``ping timeout`` or a broken pipe, and its error messages would blame those peers. The watchdog
sleeps ``interval_s`` at a time and measures how late it wakes: a lateness past ``threshold_s`` is a stall,
logged once as a warning (with its length) and counted. :meth:`recent_stall_s` tells a caller whether a
failure it is handling came out of a stall.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import structlog
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

log = structlog.get_logger(__name__)


class LoopWatchdog:
    def __init__(self, interval_s: float = 0.1, threshold_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.threshold_s = threshold_s
        self.clock = clock
        self.stalls_total = 0
        self.stalled_seconds_total = 0.0
        self._last_tick = clock()
        self._last_stall_end = float("-inf")
        self._last_stall_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._last_tick = self.clock()
            self._task = asyncio.create_task(self._watch(), name="loop-watchdog")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.tick()

    def tick(self) -> None:
        """One wake-up (the watch loop's; tests call it with a fake clock)."""
        now = self.clock()
        late = now - self._last_tick - self.interval_s
        self._last_tick = now
        if late > self.threshold_s:
            self.stalls_total += 1
            self.stalled_seconds_total += late
            self._last_stall_end, self._last_stall_s = now, late
            log.warning("event loop stalled: the process was paused, starved of CPU or blocked; peers may have "
                        "timed out its calls meanwhile", stalled_s=round(late, 2))

    def recent_stall_s(self, within_s: float = 2.0) -> float:
        """The length of a stall that ended less than ``within_s`` ago, or of one still being recovered from
        (the watchdog has not woken since); 0.0 when there was none."""
        now = self.clock()
        if self._task is not None and now - self._last_tick - self.interval_s > self.threshold_s:
            return now - self._last_tick - self.interval_s
        return self._last_stall_s if now - self._last_stall_end < within_s else 0.0


class StallCollector(Collector):
    """``pdserve_event_loop_stalls_total`` and ``pdserve_event_loop_stalled_seconds_total``."""

    def __init__(self, watchdog: LoopWatchdog) -> None:
        self.watchdog = watchdog

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("pdserve_event_loop_stalls", "Times the event loop did not run for longer "
                                  "than the watchdog's threshold (paused, starved of CPU, or blocked)",
                                  value=self.watchdog.stalls_total)
        yield CounterMetricFamily("pdserve_event_loop_stalled_seconds", "Seconds the event loop stood still in "
                                  "those stalls", value=self.watchdog.stalled_seconds_total)

"""Runs an :class:`LLMEngine` on its own thread and bridges it to asyncio.

The model part of a step blocks for tens of milliseconds, so the loop runs on a dedicated thread. The
engine's control state (scheduler, block pool, reservations) is guarded by one lock, which the engine
thread holds only while it schedules a step and while it records its results — not while the model
runs. Control calls from the event loop (:meth:`EngineWorker.call`: add, abort, reserve, commit, release,
status) take the same lock, so they wait at most for that bookkeeping, never for a model step. Aborts of
requests inside the running step are deferred by the engine until the step ends.

After each step the worker calls ``on_step(engine, outputs)`` under the lock (to read KV that just
became complete, for instance) and hands its result to ``deliver`` on the event loop; ``on_tick(engine)``
runs on every turn of the loop (lease expiry, say) and a truthy result is delivered the same way.
With tracing on, each step's spans of traced requests are recorded (``step_spans.py``).

An exception that escapes the engine thread is recorded (``failure``; every later :meth:`EngineWorker.call`
raises ``EngineStoppedError`` naming it), logged, and handed to ``on_failure(exc)`` on the event loop: the
node ends its streams with it and the process fails fast (``serve.py``).

Threads: the model's torch ops run on the engine thread with ``num_threads`` OpenMP threads. The process's
main thread should keep torch at one thread (:func:`single_threaded_main`): once two OpenMP thread pools
exist on a machine with as many cores as one pool's threads, libgomp stops spinning between parallel
regions, and every small op of a step pays a wake-up (measured here: prefill 45% slower, element-wise ops
2× slower).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
import torch

from services.common import tracing
from services.engine.engine import LLMEngine
from services.engine.errors import EngineStoppedError
from services.engine.outputs import RequestOutput
from services.engine_node.step_spans import record_step

log = structlog.get_logger(__name__)
T = TypeVar("T")
StepHook = Callable[[LLMEngine, list[RequestOutput]], Any]


class EngineWorker:
    def __init__(self, engine: LLMEngine, deliver: Callable[[Any], None], on_step: StepHook | None = None,
                 tick_s: float = 0.05, on_tick: Callable[[LLMEngine], Any] | None = None,
                 num_threads: int | None = None, on_failure: Callable[[BaseException], None] | None = None):
        self.engine = engine
        self.num_threads = num_threads or os.cpu_count() or 1
        self.lock = threading.Lock()
        self._deliver = deliver
        self._on_step = on_step or (lambda _engine, outputs: outputs)
        self._on_tick = on_tick
        self._on_failure = on_failure
        self._tick_s = tick_s
        self._wake = threading.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    @property
    def stopped(self) -> bool:
        """Stopping, stopped or failed: :meth:`call` raises, the engine and what it held are going away."""
        return self._stopping or self.failure is not None

    async def stop(self) -> None:
        """Stop the engine thread, then close the engine (its background threads and channels)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self.engine.close()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(engine, *args)`` under the engine lock (waiting at most for a step's bookkeeping, not for
        the model); its result or exception comes back here. ``fn`` is a named engine call, e.g.
        ``await worker.call(LLMEngine.abort, request_id)``. Wakes an idle engine thread. Raises
        ``EngineStoppedError`` once the worker stopped or its thread failed: the node's calls fail
        ``UNAVAILABLE`` then, its ``NodeStatus`` too (the gateway counts it unhealthy)."""
        if self._stopping or self.failure is not None:
            raise EngineStoppedError(f"engine {'failed: ' + repr(self.failure) if self.failure else 'is stopped'}")
        with self.lock:
            result = fn(self.engine, *args)
        self._wake.set()
        return result

    async def released(self, request_id: str, poll_s: float = 0.005) -> None:
        """Return once the engine holds nothing under ``request_id`` (after an abort: at the end of the
        step that was running it, if any), so the id may be used again."""
        while await self.call(LLMEngine.holds, request_id):
            await asyncio.sleep(poll_s)

    def _run(self) -> None:
        engine = self.engine
        try:
            torch.set_num_threads(self.num_threads)  # OpenMP thread count is per calling thread
            while not self._stopping:
                self._wake.clear()
                with self.lock:
                    ticked = self._on_tick(engine) if self._on_tick is not None else None
                    planned = engine.begin_step() if engine.has_unfinished() else None
                if ticked:
                    self._post(self._deliver, ticked)
                if planned is None:
                    self._wake.wait(self._tick_s)
                    continue
                started_ns = time.time_ns() if tracing.enabled() else 0
                sampled = engine.execute_step(planned)
                with self.lock:
                    if started_ns:  # before end_step, which ends the spans of requests that finish
                        record_step(planned.batch.scheduled, started_ns, time.time_ns())
                    payload = self._on_step(engine, engine.end_step(planned, sampled))
                self._post(self._deliver, payload)
        except BaseException as exc:  # the engine is broken: later calls fail with it, the node is told
            self.failure = exc
            log.exception("engine thread failed")
            if self._on_failure is not None:
                self._post(self._on_failure, exc)
            raise

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)


def single_threaded_main() -> None:
    """Call first on the main thread of a process whose model runs on an :class:`EngineWorker`."""
    torch.set_num_threads(1)

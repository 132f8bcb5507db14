"""Runs an :class:`LLMEngine` on its own thread and bridges it to asyncio.

The engine's model steps block for tens of milliseconds, so they run on one dedicated thread; every call
that touches the engine's control state (adding, aborting, reserving, committing, releasing) is queued
to that thread and runs *between* steps, so the scheduler and block pool are only ever touched by it.
After each step the worker calls ``on_step(engine, outputs)`` on the engine thread (to read KV that just
became complete, for instance) and hands its result to ``deliver`` on the event loop; ``on_tick(engine)``
runs on every turn of the loop (lease expiry, say) and a truthy result is delivered the same way.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from services.engine.engine import LLMEngine
from services.engine.outputs import RequestOutput

log = structlog.get_logger(__name__)
T = TypeVar("T")
StepHook = Callable[[LLMEngine, list[RequestOutput]], Any]


class EngineWorker:
    def __init__(self, engine: LLMEngine, deliver: Callable[[Any], None], on_step: StepHook | None = None,
                 tick_s: float = 0.05, on_tick: Callable[[LLMEngine], Any] | None = None):
        self.engine = engine
        self._deliver = deliver
        self._on_step = on_step or (lambda _engine, outputs: outputs)
        self._on_tick = on_tick
        self._tick_s = tick_s
        self._calls: queue.SimpleQueue[tuple[Callable[[LLMEngine], Any], asyncio.Future]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between steps; its result or exception comes back here."""
        if self._stopping or self.failure is not None:
            raise RuntimeError("engine worker is stopped")
        future = self._loop.create_future()
        self._calls.put((fn, future))
        self._wake.set()
        return await future

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stopping:
                self._run_calls()
                if self._on_tick is not None and (ticked := self._on_tick(engine)):
                    self._post(self._deliver, ticked)
                if engine.has_unfinished():
                    outputs = engine.step()
                    self._post(self._deliver, self._on_step(engine, outputs))
                else:
                    self._wake.wait(self._tick_s)
                    self._wake.clear()
            self._run_calls()
        except BaseException as exc:  # the engine is broken: fail every pending call, then report
            self.failure = exc
            log.exception("engine thread failed")
            self._fail_calls(exc)
            raise

    def _run_calls(self) -> None:
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                result = fn(self.engine)
            except Exception as exc:  # delivered to the awaiting caller, which decides what it means
                self._post(_set_exception, future, exc)
            else:
                self._post(_set_result, future, result)

    def _fail_calls(self, exc: BaseException) -> None:
        while True:
            try:
                _, future = self._calls.get_nowait()
            except queue.Empty:
                return
            self._post(_set_exception, future, RuntimeError(f"engine thread failed: {exc!r}"))

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

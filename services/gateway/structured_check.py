"""The content check of a request's structured-output spec, at the gateway, before any node works.

``SamplingParams.validate`` checks a spec's shape (kind, parts, size limits); whether a JSON schema, regex
or grammar is one the grammar library takes is found by compiling it. The gateway compiles each spec with
the engine's ``StructuredCompiler`` over its own tokenizer (the model's), so a bad one is refused with
``INVALID_ARGUMENT`` naming ``structured_output`` and the problem, and no node ever sees it.

Compiling is CPU work (a few milliseconds for a schema, lazily; a hostile grammar may take longer): it runs
on ``WORKERS`` threads of its own, off the event loop. A compile still running after ``COMPILE_TIMEOUT_S``
refuses its request (the spec is too costly for this server); a check still queued behind other compiles
then is ``UNAVAILABLE`` (the gateway is busy, the spec may be fine). Only specs that compiled are
remembered (their keys, at most ``MAX_KNOWN``), so a spec used again is not compiled again and nothing of
a refused one stays.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from services.common.errors import UnavailableError
from services.engine.errors import InvalidRequestError
from services.engine.structured_spec import StructuredSpec

FIELD = "structured_output"
WORKERS = 2
COMPILE_TIMEOUT_S = 10.0  # a compile running longer refuses its request
QUEUE_TIMEOUT_S = 30.0  # a check waiting longer for a thread is UNAVAILABLE
MAX_KNOWN = 4096  # keys of specs that compiled


class Compiler(Protocol):
    def check(self, spec: StructuredSpec) -> None:
        """Raise ``InvalidRequestError`` naming the field and the problem when ``spec`` does not compile."""


def engine_compiler(tokenizer: Any, vocab_size: int) -> Compiler:
    """The engine's compiler (imported here: it loads the grammar library, which a gateway that never sees a
    constrained request does not need)."""
    from services.engine.structured.compiler import StructuredCompiler

    return StructuredCompiler(tokenizer, vocab_size)


class StructuredChecks:
    """``await check(spec)``: returns when ``spec`` compiles; ``InvalidRequestError`` when it does not (or its
    compile runs past ``compile_timeout_s``); ``UnavailableError`` when it waited ``queue_timeout_s`` for a
    thread. ``make_compiler()`` is called once, on a worker thread, by the first check (its time is not the
    spec's: the compile timeout starts after it)."""

    def __init__(self, make_compiler: Callable[[], Compiler], *, workers: int = WORKERS,
                 compile_timeout_s: float = COMPILE_TIMEOUT_S, queue_timeout_s: float = QUEUE_TIMEOUT_S,
                 max_known: int = MAX_KNOWN) -> None:
        self._make_compiler = make_compiler
        self._compiler: Compiler | None = None
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="structured")
        self.compile_timeout_s = compile_timeout_s
        self.queue_timeout_s = queue_timeout_s
        self._known: OrderedDict[str, None] = OrderedDict()
        self._max_known = max_known
        self.compiles = 0  # specs compiled (not answered from the known keys)

    async def check(self, spec: StructuredSpec | None) -> None:
        if spec is None:
            return
        key = spec.key
        if key in self._known:
            self._known.move_to_end(key)
            return
        loop = asyncio.get_running_loop()
        started: asyncio.Future[float] = loop.create_future()  # when a thread took it

        def take(spec: StructuredSpec) -> None:
            compiler = self._ensure_compiler()  # the first check builds it: not counted as the spec's compile
            now = time.monotonic()
            loop.call_soon_threadsafe(lambda: started.done() or started.set_result(now))
            self.compiles += 1
            compiler.check(spec)

        work = loop.run_in_executor(self._pool, contextvars.copy_context().run, take, spec)
        await asyncio.wait([started, work], timeout=self.queue_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if work.done():  # done, or failed before the compile began (the compiler could not be built)
            work.result()
        elif not started.done():
            work.cancel()  # not taken by a thread yet: it never runs
            raise UnavailableError(f"the gateway is busy compiling structured outputs (waited over "
                                   f"{self.queue_timeout_s:g}s for a thread); retry later")
        began = started.result() if started.done() else time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(work), max(0.0, began + self.compile_timeout_s - time.monotonic()))
        except TimeoutError:  # the thread finishes it and drops it: nothing of it is kept
            raise InvalidRequestError(FIELD, f"compiling it took over {self.compile_timeout_s:g}s (too costly a "
                                             f"schema, regex or grammar for this server)") from None
        self._known[key] = None
        while len(self._known) > self._max_known:
            self._known.popitem(last=False)

    def _ensure_compiler(self) -> Compiler:
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = self._make_compiler()
            return self._compiler

    def close(self) -> None:
        """Stop the threads once what was taken is done."""
        self._pool.shutdown(wait=False)

"""A circuit breaker for a client of the cache-store: a node's calls to a store that stopped answering
fail fast instead of each waiting out its own timeout.

The cache-store is an optimisation everywhere it is used: a decode node keeps preempted KV there
(``services/engine/kv_offload.py``) and caches finished requests' blocks (``output_cache.py``); a prefill
node fetches prompt blocks from it and writes its own back (``services/prefill_node/prefix_store.py``).
Each call is bounded by its client's timeout, but a store that stops answering (a hung process, a
partition) would cost that timeout again and again: a preempted request's fetch queued behind ten hung
puts on the offload's one I/O thread waited five minutes; every prompt on a prefill node waited the
5 s lookup timeout. Once one call fails for the store's sake (it timed out, the store could not be
reached), :meth:`StoreBreaker.call` / :meth:`call_async` fail every call fast for
``cooldown_s`` with :class:`StoreUnavailable`, and :meth:`is_open` lets a caller not even start (a
victim stays in host memory or is recomputed, a prompt is computed, a write-back is dropped). After the
cooldown the next call tries the store again (one failure reopens the breaker at once).

An answer that says the store is working (``NOT_FOUND``: a copy aged out; ``INVALID_ARGUMENT``) is not the
store's fault and leaves the breaker closed. Thread-safe (the state is a float and a string, each written
whole); used from worker threads and from event loops alike.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")

# the store did not answer or could not be reached (RESOURCE_EXHAUSTED: that one put does not fit; the store
# works)
STORE_FAULT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class StoreUnavailable(ConnectionError):
    """A cache-store call not tried: the store failed moments ago."""


def is_store_fault(error: BaseException) -> bool:
    if isinstance(error, grpc.RpcError) and callable(getattr(error, "code", None)):
        return error.code() in STORE_FAULT_CODES
    return isinstance(error, (ConnectionError, TimeoutError))


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError) and callable(getattr(error, "code", None)):
        details = error.details() if callable(getattr(error, "details", None)) else ""
        return f"{error.code().name}: {details}" if details else error.code().name
    return repr(error)


class StoreBreaker:
    def __init__(self, cooldown_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.trips_total = 0  # times a failure opened it
        self._failed_at: float | None = None
        self._reason = ""

    def is_open(self) -> bool:
        failed_at = self._failed_at
        return failed_at is not None and self.clock() - failed_at < self.cooldown_s

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)``, unless the store failed less than ``cooldown_s`` ago: then
        :class:`StoreUnavailable` naming that failure, without calling it."""
        self.check()
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            self.failed(error)
            raise

    async def call_async(self, fn: Callable[..., Awaitable[T]], *args, **kwargs) -> T:
        """:meth:`call` for a coroutine function."""
        self.check()
        try:
            return await fn(*args, **kwargs)
        except Exception as error:
            self.failed(error)
            raise

    def check(self) -> None:
        """:class:`StoreUnavailable` if the store failed less than ``cooldown_s`` ago."""
        failed_at = self._failed_at
        if failed_at is not None and (ago := self.clock() - failed_at) < self.cooldown_s:
            raise StoreUnavailable(f"not tried: the cache-store failed {ago:.1f} s ago ({self._reason}); it is "
                                   f"tried again in {self.cooldown_s - ago:.1f} s")

    def failed(self, error: BaseException) -> None:
        """A call failed with ``error``: open the breaker if the store is to blame."""
        if is_store_fault(error) and not isinstance(error, StoreUnavailable):
            self.trip(error)

    def trip(self, error: BaseException) -> None:
        was_open = self.is_open()
        self._reason = _describe(error)
        self._failed_at = self.clock()
        if not was_open:
            self.trips_total += 1
            log.warning("the cache-store failed; calls to it fail fast for a while", cooldown_s=self.cooldown_s,
                        error=self._reason)

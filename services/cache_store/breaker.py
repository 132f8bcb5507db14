"""A circuit breaker for a client of the cache-store: a node's calls to a store that stopped answering
fail fast instead of each waiting out its own timeout.

The cache-store is an optimisation everywhere it is used: a decode node keeps preempted KV there
(``services/engine/kv_offload.py``) and caches finished requests' blocks (``output_cache.py``), each through
an adapter with a breaker of its own (``services/engine_node/remote_store.py``, which turns the errors into
the engine's ``RemoteStore*`` ones); a prefill
node fetches prompt blocks from it and writes its own back (``services/prefill_node/prefix_store.py``).
Each call is bounded by its client's timeout, but a store that stops answering (a hung process, a
partition) would cost that timeout again and again: a preempted request's fetch queued behind ten hung
puts on the offload's one I/O thread waited five minutes; every prompt on a prefill node waited the
5 s lookup timeout. Once one call fails for the store's sake (it timed out, the store could not be
reached), :meth:`StoreBreaker.call` / :meth:`call_async` fail every call fast for
``cooldown_s`` with :class:`StoreUnavailable`, and :meth:`is_open` lets a caller not even start (a
victim stays in host memory or is recomputed, a prompt is computed, a write-back is dropped). After the
cooldown one call goes through as a test while the others still fail fast: its answer closes the
breaker, its failure opens it for another cooldown (so a store that stays hung costs one timeout per
cooldown, not one per waiting call).

An answer that says the store is working (``NOT_FOUND``: a copy aged out; ``INVALID_ARGUMENT``) is not the
store's fault and leaves the breaker closed. Thread-safe (a lock guards the state); used from worker
threads and from event loops alike.
"""

from __future__ import annotations

import threading
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
    """The store did not answer or could not be reached (a call the breaker refused says nothing new)."""
    if isinstance(error, grpc.RpcError) and callable(getattr(error, "code", None)):
        return error.code() in STORE_FAULT_CODES
    return isinstance(error, (ConnectionError, TimeoutError)) and not isinstance(error, StoreUnavailable)


def describe(error: BaseException) -> str:
    """``CODE: details`` for a gRPC error, else its repr (for logs and span statuses)."""
    if isinstance(error, grpc.RpcError) and callable(getattr(error, "code", None)):
        details = error.details() if callable(getattr(error, "details", None)) else ""
        return f"{error.code().name}: {details}" if details else error.code().name
    return repr(error)


class StoreBreaker:
    def __init__(self, cooldown_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.trips_total = 0  # times a failure opened it (a failed test call keeps it open: not counted)
        self._lock = threading.Lock()
        self._failed_at: float | None = None  # None: closed
        self._reason = ""
        self._probing = False  # after the cooldown: the one test call is in flight

    def is_open(self) -> bool:
        """Calls fail fast now: within the cooldown, or after it while the one test call is in flight."""
        with self._lock:
            return self._failed_at is not None and (self._probing or self._cooling() > 0)

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)``; :class:`StoreUnavailable` naming the failure, without calling it, while
        the breaker is open. After the cooldown one call goes through as a test: the others fail fast
        until it answers (closing the breaker) or fails (opening it for another cooldown)."""
        probe = self._admit()
        try:
            result = fn(*args, **kwargs)
        except Exception as error:
            self._ended(probe, error)
            raise
        except BaseException:
            self._abandoned(probe)
            raise
        self._ended(probe, None)
        return result

    async def call_async(self, fn: Callable[..., Awaitable[T]], *args, **kwargs) -> T:
        """:meth:`call` for a coroutine function (a cancelled test call lets the next one test)."""
        probe = self._admit()
        try:
            result = await fn(*args, **kwargs)
        except Exception as error:
            self._ended(probe, error)
            raise
        except BaseException:  # cancelled: no answer either way
            self._abandoned(probe)
            raise
        self._ended(probe, None)
        return result

    def failed(self, error: BaseException) -> None:
        """A call made without :meth:`call` failed with ``error``: open the breaker if the store is to blame."""
        if is_store_fault(error):
            self._trip(error)

    def _cooling(self) -> float:
        """Seconds of cooldown left (lock held, breaker not closed)."""
        assert self._failed_at is not None
        return self.cooldown_s - (self.clock() - self._failed_at)

    def _admit(self) -> bool:
        """Let a call through (True: as the test call) or raise :class:`StoreUnavailable`."""
        with self._lock:
            if self._failed_at is None:
                return False
            left = self._cooling()
            if left > 0:
                raise StoreUnavailable(f"not tried: the cache-store failed {self.cooldown_s - left:.1f} s ago "
                                       f"({self._reason}); it is tried again in {left:.1f} s")
            if self._probing:
                raise StoreUnavailable(f"not tried: the cache-store failed ({self._reason}); a test call to it "
                                       f"is in flight")
            self._probing = True
            return True

    def _ended(self, probe: bool, error: Exception | None) -> None:
        """A call ended with an answer (``error`` None, or one that is not the store's fault, e.g.
        ``NOT_FOUND``) or a store fault."""
        if error is not None and is_store_fault(error):
            self._trip(error)
        elif probe:
            with self._lock:
                self._probing = False
                self._failed_at = None
            log.info("the cache-store answers again: calls to it go through")

    def _abandoned(self, probe: bool) -> None:
        """A call was cancelled before it ended: a test call's turn passes to the next call."""
        if probe:
            with self._lock:
                self._probing = False

    def _trip(self, error: BaseException) -> None:
        with self._lock:
            reopened = self._failed_at is not None
            self._reason = describe(error)
            self._failed_at = self.clock()
            self._probing = False
            if not reopened:
                self.trips_total += 1
        if not reopened:
            log.warning("the cache-store failed; calls to it fail fast for a while", cooldown_s=self.cooldown_s,
                        error=self._reason)

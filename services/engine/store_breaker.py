"""A circuit breaker for the engine's cache-store calls (preempted KV put and fetched back, finished
requests' blocks cached).

Those calls run one after another on background threads, each bounded by the client's 30 s timeout. A
cache-store that stops answering (a hung process, a partition) would otherwise make every queued call
wait out its own timeout in turn: a preempted request whose fetch sits behind ten hung puts would wait
five minutes before being recomputed. Once one call fails for the store's sake (it timed out, or the
store could not be reached), :meth:`StoreBreaker.call` fails every call fast for ``cooldown_s`` with
:class:`StoreUnavailable`, and :meth:`is_open` tells the scheduler's side not to send new copies there:
preempted requests are kept in host memory while it has room, or recomputed. After the cooldown the next
call tries the store again (one failure reopens the breaker at once).

An answer that says the store is working (``NOT_FOUND``: a copy aged out; ``INVALID_ARGUMENT``) is not the
store's fault and leaves the breaker closed. Torch-free and gRPC-free apart from reading a status code;
thread-safe (the state is two floats and a string, written whole).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")

# the store did not answer, could not be reached, or could not take the call now
STORE_FAULT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                               grpc.StatusCode.RESOURCE_EXHAUSTED})


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
        failed_at = self._failed_at
        if failed_at is not None and (ago := self.clock() - failed_at) < self.cooldown_s:
            raise StoreUnavailable(f"not tried: the cache-store failed {ago:.1f} s ago ({self._reason}); it is "
                                   f"tried again in {self.cooldown_s - ago:.1f} s")
        try:
            return fn(*args, **kwargs)
        except BaseException as error:
            if is_store_fault(error):
                self.trip(error)
            raise

    def trip(self, error: BaseException) -> None:
        was_open = self.is_open()
        self._reason = _describe(error)
        self._failed_at = self.clock()
        if not was_open:
            self.trips_total += 1
            log.warning("the cache-store failed; calls to it fail fast for a while (preempted requests stay in "
                        "host memory or are recomputed)", cooldown_s=self.cooldown_s, error=self._reason)

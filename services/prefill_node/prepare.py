"""Reserving a decode node for a request: one queue per decode node (DESIGN.md section 3, concurrent prepare).

Every decode node has its own queue with at most ``concurrency`` ``Reserve`` calls in flight. A request
waits in the queue of the node it is trying, so a full or slow decode node holds only the requests that
are trying it, never those bound for another node. Per request (:meth:`PrepareQueues.reserve`):

1. one quick pass: each candidate, in order, is asked once where it has a free slot (a refusal moves on
   to the next at once, as ``decode.proto`` promises the gateway);
2. then the candidates are visited in turn: a visit retries its node after each refusal with exponential
   backoff (``backoff_s`` doubling up to ``backoff_max_s``, or the node's ``retry_after_ms`` if longer) for
   at most ``wait_s`` (the whole remaining time when only one candidate is left), then the next one;
3. until the deadline (the caller's, less a margin so the error reaches the caller before its own
   deadline does; ``timeout_s`` when the caller has none): then :class:`ResourceExhaustedError` with the
   last reason of each node — or, when no node could ever take it, :class:`InvalidArgumentError` (every
   node refused the request itself: longer than its KV pool or context) or
   :class:`FailedPreconditionError` (its KV layout: another model, dtype or block size — a configuration
   error); neither is worth a retry. When no node could be reached at all (every ``Reserve`` failed
   ``UNAVAILABLE``: down, restarting), :class:`UnavailableError` — the cluster is not full, it is missing
   its decode nodes.

A node whose ``Reserve`` fails with an RPC error is dropped for this request. What the caller reads of it
(its ``Refused`` reason, the final status) says no more than "decode node unreachable" (or, from a node
that answered and then failed, "decode node failed the reservation"): the gateway names the candidates,
and a text that told a refused connection from a silent port from an unknown host would make this node a
port scanner of its network. gRPC's own details go to this node's log, with the request id and address.
Only the errors in which a decode node answered about the request (``INVALID_ARGUMENT``,
``FAILED_PRECONDITION``) reach the caller as they are. ``UNIMPLEMENTED`` (no ``DecodeNode`` service
there) counts as unreachable, as does a ``Reserve`` that timed out before its channel ever connected
(``decode_client.py`` turns that into ``UNAVAILABLE``), so a closed port and a silent one read the same.

A queue exists while a request is trying its node (waiting for a slot, backing off or in a ``Reserve``
call); an idle one is dropped, so the addresses callers name leave nothing behind.

Backoff sleeps hold no slot. Cancelling the caller leaves nothing behind: its slot is released, and if a
``Reserve`` was in flight (it may be granted, unseen) it is let finish in the background and a grant is
aborted on that node — after the answer, so the ``Abort`` cannot overtake the ``Reserve`` on the wire and
find nothing; :meth:`PrepareQueues.settled` (one request) and :meth:`PrepareQueues.close` (all) wait for
those. A ``Reserve`` whose outcome stays unknown (deadline, cancelled) is aborted in case it was granted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import grpc
import grpc.aio
import structlog

from services.common.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnavailableError,
)

log = structlog.get_logger(__name__)

# Outcomes of a Reserve call whose grant may exist on the decode node although the caller never saw it.
_AMBIGUOUS = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# A decode node's answer about the request (its KV layout, the request itself): the caller reads it as it is.
_ANSWERED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
# No decode node reached at that address (down, no such host, a silent port, another service).
_UNREACHABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED)

UNREACHABLE = "decode node unreachable"
"""The one reason a caller reads for a candidate that could not be reached, however it failed."""
FAILED = "decode node failed the reservation"
"""The reason a caller reads for any other RPC error of a candidate (its details are only logged)."""


class Answer(Protocol):
    """What a decode node answers to ``Reserve`` (``decode_client.Grant`` is one)."""

    granted: bool
    reason: str
    retry_after_ms: int


A = TypeVar("A", bound=Answer)
ReserveCall = Callable[[str, float], Awaitable[A]]  # (decode address, RPC timeout in s) → answer
AbortCall = Callable[[str], Awaitable[object]]  # (decode address) → frees the request's reservation there


@dataclass(frozen=True)
class Refused:
    decode_address: str
    reason: str


@dataclass(frozen=True)
class Reservation(Generic[A]):
    address: str
    answer: A
    refusals: list[Refused]  # at most one per node per pass, in the order they happened


@dataclass(frozen=True)
class PrepareSettings:
    concurrency: int = 8  # Reserve calls in flight per decode node
    wait_s: float = 2.0  # longest visit of one node before trying the next
    backoff_s: float = 0.02  # first retry delay after a refusal; doubles
    backoff_max_s: float = 0.5
    timeout_s: float = 30.0  # deadline when the caller gives none
    rpc_timeout_s: float = 10.0  # longest one Reserve call may take
    deadline_margin_s: float = 0.2  # give up this much (at most a tenth of the time) before the caller


@dataclass
class _Queue:
    slots: asyncio.Semaphore
    waiting: int = 0  # requests trying this node, not in a Reserve call (queued for a slot, backing off)
    in_flight: int = 0


@dataclass
class _Try:
    """One request's state on one candidate."""

    delay: float
    not_before: float = 0.0  # no attempt before this (loop time)
    reason: str = "not tried: no free slot before the deadline"
    reported: bool = False  # a Refused was recorded in this pass
    dropped: bool = False  # an RPC error: not tried again
    error: grpc.StatusCode | None = None  # that error's code


@dataclass
class _Request(Generic[A]):
    request_id: str
    call: ReserveCall[A]
    abort: AbortCall
    deadline: float
    tries: dict[str, _Try]
    refusals: list[Refused] = field(default_factory=list)

    def live(self) -> list[str]:
        return [address for address, state in self.tries.items() if not state.dropped]


class PrepareQueues:
    """The per-decode-node queues of one prefill node. Counters: :meth:`waiting`, :meth:`in_flight`,
    ``reserve_refusals_total`` (every refusal answer), ``reserve_errors_total`` (every RPC error)."""

    def __init__(self, settings: PrepareSettings = PrepareSettings()):
        assert settings.concurrency >= 1 and settings.wait_s > 0, f"bad prepare settings {settings}"
        self.settings = settings
        self.reserve_refusals_total = 0
        self.reserve_errors_total = 0
        self._queues: dict[str, _Queue] = {}
        self._aborts: dict[asyncio.Task[object], str] = {}  # → the request id

    def waiting(self, address: str) -> int:
        return self._queues[address].waiting if address in self._queues else 0

    def in_flight(self, address: str) -> int:
        return self._queues[address].in_flight if address in self._queues else 0

    def waiting_by_node(self) -> dict[str, int]:
        return {address: queue.waiting for address, queue in self._queues.items()}

    async def close(self) -> None:
        """Wait for the background aborts of cancelled reservations."""
        while self._aborts:
            await asyncio.wait(list(self._aborts))  # not gather: a cancelled wait leaves the aborts running

    async def settled(self, request_id: str) -> None:
        """Wait for the background aborts of ``request_id``'s cancelled reservations."""
        mine = [task for task, rid in self._aborts.items() if rid == request_id]
        if mine:
            await asyncio.wait(mine)

    async def reserve(self, request_id: str, candidates: list[str], call: ReserveCall[A], abort: AbortCall,
                      timeout_s: float | None = None) -> Reservation[A]:
        """Reserve on one of ``candidates`` (see the module docstring). ``call(address, rpc_timeout_s)``
        sends the ``Reserve``; ``abort(address)`` undoes a grant the caller may not have seen. Raises
        :class:`ResourceExhaustedError` at the deadline, or at once when every candidate failed (or the
        more precise error the module docstring names)."""
        loop = asyncio.get_running_loop()
        request = _Request(request_id, call, abort, loop.time() + self._budget(timeout_s),
                           {address: _Try(self.settings.backoff_s) for address in dict.fromkeys(candidates)})
        for address in request.live():  # the quick pass
            queue = self._queues.get(address)
            if queue is None or not queue.slots.locked():
                answer = await self._visit(request, address, end=loop.time(), quick=True)
                if answer is not None:
                    return Reservation(address, answer, request.refusals)
        while request.live() and loop.time() < request.deadline:
            for address in request.live():
                now = loop.time()
                if now >= request.deadline:
                    break
                alone = len(request.live()) == 1
                end = request.deadline if alone else min(request.deadline, now + self.settings.wait_s)
                request.tries[address].reported = False
                answer = await self._visit(request, address, end)
                if answer is not None:
                    return Reservation(address, answer, request.refusals)
        reasons = "; ".join(f"{address}: {state.reason}" for address, state in request.tries.items())  # sanitized
        codes = {state.error for state in request.tries.values()}
        if codes == {grpc.StatusCode.INVALID_ARGUMENT}:  # the request itself (past every node's KV pool)
            raise InvalidArgumentError("request", f"no decode node can take request {request_id!r}: {reasons}")
        if codes and codes <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}:
            raise FailedPreconditionError(f"no decode node can use this prefill node's KV ({reasons})")
        if codes == {grpc.StatusCode.UNAVAILABLE}:  # none answered: not a shortage
            # every candidate alike, naming none: the per-address outcome is in this node's log
            raise UnavailableError(f"no decode node could be reached for request {request_id!r}: {UNREACHABLE}")
        raise ResourceExhaustedError(f"no decode node could take request {request_id!r} "
                                     f"({reasons or 'no decode candidates'})")

    def _budget(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self.settings.timeout_s
        return max(0.0, timeout_s - min(self.settings.deadline_margin_s, timeout_s / 10))

    def _queue(self, address: str) -> _Queue:
        if address not in self._queues:
            self._queues[address] = _Queue(asyncio.Semaphore(self.settings.concurrency))
        return self._queues[address]

    async def _visit(self, request: _Request[A], address: str, end: float, quick: bool = False) -> A | None:
        """Try ``address`` until granted (the answer), or until ``end``, a drop or the deadline (None).
        ``quick``: one attempt, now (the caller checked that a slot is free)."""
        loop = asyncio.get_running_loop()
        state, queue = request.tries[address], self._queue(address)
        queue.waiting += 1
        try:
            while not state.dropped:
                now = loop.time()
                if not quick:
                    if state.not_before > now:  # a retry due after ``end`` waits for the next visit
                        await asyncio.sleep(min(state.not_before, end) - now)
                    if loop.time() >= end:
                        return None
                if not await _take_slot(queue.slots, None if quick else end - loop.time()):
                    return None
                try:
                    queue.waiting -= 1
                    queue.in_flight += 1
                    answer = await self._attempt(request, address, state)
                finally:
                    queue.in_flight -= 1
                    queue.waiting += 1
                    queue.slots.release()
                if answer is not None or quick:
                    return answer
            return None
        finally:
            queue.waiting -= 1
            if not queue.waiting and not queue.in_flight and self._queues.get(address) is queue:
                del self._queues[address]  # idle: nobody is trying this node now

    async def _attempt(self, request: _Request[A], address: str, state: _Try) -> A | None:
        """One ``Reserve`` call (the caller holds a slot); records a refusal or an error in ``state``."""
        loop = asyncio.get_running_loop()
        left = request.deadline - loop.time()
        if left <= 0:
            return None
        call = asyncio.ensure_future(request.call(address, min(self.settings.rpc_timeout_s, left)))
        try:
            answer = await asyncio.shield(call)
        except asyncio.CancelledError:
            self._abort_if_granted(request, address, call)  # granted on the node, perhaps, and nobody would know
            raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _AMBIGUOUS:
                self._abort_later(request, address)
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and loop.time() >= request.deadline - 0.01:
                return None  # cut short by the request's own deadline: not the node's failure
            self.reserve_errors_total += 1
            code = grpc.StatusCode.UNAVAILABLE if exc.code() in _UNREACHABLE_CODES else exc.code()
            state.dropped, state.error = True, code
            log.info("decode candidate failed", request_id=request.request_id, decode_node=address,
                     code=exc.code().name, details=exc.details())
            self._refuse(request, address, state, _caller_reason(code, exc))
            return None
        if answer.granted:
            return answer
        self.reserve_refusals_total += 1
        hint = min(answer.retry_after_ms / 1000, self.settings.backoff_max_s)
        state.not_before = loop.time() + max(state.delay, hint)
        state.delay = min(state.delay * 2, self.settings.backoff_max_s)
        self._refuse(request, address, state, answer.reason or "refused")
        return None

    def _refuse(self, request: _Request[A], address: str, state: _Try, reason: str) -> None:
        state.reason = reason
        if not state.reported:
            state.reported = True
            request.refusals.append(Refused(address, reason))

    def _abort_if_granted(self, request: _Request[A], address: str, call: asyncio.Future[A]) -> None:
        """The caller left while ``call`` was on the wire: let it finish (an Abort sent now could reach the
        node before the Reserve and find nothing, leaving the grant to its lease) and abort a grant."""

        async def abort_if_granted() -> None:
            try:
                answer = await call
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _AMBIGUOUS:
                    await request.abort(address)
                return
            if answer.granted:
                await request.abort(address)

        self._track(request, asyncio.ensure_future(abort_if_granted()))

    def _abort_later(self, request: _Request[A], address: str) -> None:
        self._track(request, asyncio.ensure_future(request.abort(address)))

    def _track(self, request: _Request[A], task: asyncio.Future[object]) -> None:
        self._aborts[task] = request.request_id
        task.add_done_callback(lambda done: self._aborts.pop(done, None))


def _caller_reason(code: grpc.StatusCode, exc: grpc.aio.AioRpcError) -> str:
    """What the caller reads of a candidate's RPC error (module docstring): nothing of gRPC's details
    unless a decode node answered about the request."""
    if code in _ANSWERED:
        return f"{code.name}: {exc.details()}"
    return UNREACHABLE if code == grpc.StatusCode.UNAVAILABLE else FAILED


async def _take_slot(slots: asyncio.Semaphore, timeout_s: float | None) -> bool:
    """Take a slot within ``timeout_s`` (None: however long it takes). False: timed out, holding nothing."""
    if timeout_s is None or not slots.locked():
        return await slots.acquire()
    waiter = asyncio.ensure_future(slots.acquire())
    try:
        await asyncio.wait({waiter}, timeout=max(0.0, timeout_s))
    finally:
        if not waiter.done():  # timed out, or the caller was cancelled
            waiter.cancel()
            waiter.add_done_callback(lambda w: w.cancelled() or slots.release())
    return waiter.done() and not waiter.cancelled()

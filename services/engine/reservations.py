"""Decode-side reservations: KV blocks granted to a prefill node, as a lease, for one request's prompt.

Life of a reservation: :meth:`ReservationBook.reserve` (granted or refused, nothing allocated when
refused) → :meth:`receive` for each block batch the prefill node sends (renews the lease) →
:meth:`commit` once every block arrived: the request's prompt blocks enter the prefix index and it joins
the decode batch. A lease that passes without traffic, or :meth:`cancel`, frees everything.
A request refused for room is remembered (``reserve_waiters.py``): the blocks the oldest one still asking
needs are kept from other grants and adoptions, so a large prompt is not starved by smaller later ones —
for at most ``max_protected_s`` (30 s, about how long a prefill node keeps asking for one request) after
its first refusal: then it goes to the back of the line (forgotten; its next refusal records it anew), so a
caller re-asking a large reservation, one that may never fit, holds blocks back no longer than a
legitimate waiter would wait (the decode node also bounds what one caller may ask, ``grants.py``).
All methods run on the engine thread (they touch the block pool and the scheduler).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from kvcache.manager import KVCacheManager
from services.engine.errors import EngineError, InvalidRequestError, UnknownRequestError
from services.engine.request import Request
from services.engine.reserve_waiters import ReserveWaiters
from services.engine.scheduler import Scheduler


class LeaseExpiredError(UnknownRequestError):
    """The reservation's lease ran out (or it never existed): its blocks went back to the pool."""


class IncompleteTransferError(EngineError):
    """A commit arrived before every granted block was received."""


@dataclass
class Reservation:
    request: Request
    block_ids: list[int]
    num_cached_blocks: int
    lease_s: float
    lease_deadline: float
    received: set[int] = field(default_factory=set)
    recurrent_state: bytearray = field(default_factory=bytearray)  # a hybrid model's, as its pieces arrive

    @property
    def pending_block_ids(self) -> list[int]:
        return [b for b in self.block_ids[self.num_cached_blocks:] if b not in self.received]


@dataclass(frozen=True)
class Refusal:
    reason: str


class ReservationBook:
    def __init__(self, kv: KVCacheManager, scheduler: Scheduler, clock=time.monotonic,
                 max_protected_s: float = 30.0):
        self.kv = kv
        self.scheduler = scheduler
        self.clock = clock
        self.max_protected_s = max_protected_s
        self.reservations: dict[str, Reservation] = {}
        self.waiters = ReserveWaiters(clock=clock)

    @property
    def num_reserved_blocks(self) -> int:
        return sum(len(r.block_ids) for r in self.reservations.values())

    def reserve(self, request: Request, lease_s: float) -> Reservation | Refusal:
        """Grant blocks for ``request``'s prompt if a batch slot is free (``max_num_seqs``) and the running
        requests, and those already granted that will run here, keep the headroom the scheduler's admission
        policy asks for."""
        rid = request.request_id
        if rid in self.reservations or self.kv.has_request(rid):
            raise InvalidRequestError("request_id", f"request {rid!r} already holds blocks here")
        full = self.no_free_slot()
        if full is not None:
            return full
        prompt = request.prompt_token_ids
        prefix = self.kv.match_prefix(prompt)
        needed = self.kv.blocks_needed(rid, len(prompt), prefix)
        refusal = self.no_room(rid, needed)
        if refusal is not None:
            self.waiters.refused(rid, needed)
            return refusal
        self.waiters.forget(rid)
        block_ids = self.kv.allocate(rid, len(prompt), prefix)
        if block_ids is None:  # cannot happen after the check above, but never hand out what we lack
            return Refusal(f"no room: {needed} blocks needed")
        request.num_cached_tokens = prefix.num_tokens
        reservation = Reservation(request, self.kv.block_ids(rid), prefix.num_blocks, lease_s,
                                  self.clock() + lease_s)
        self.reservations[rid] = reservation
        return reservation

    def no_free_slot(self) -> Refusal | None:
        """A refusal when the requests that will decode here (running, waiting to resume, granted) already
        fill ``max_num_seqs``; a granted request would otherwise join a batch over the limit."""
        scheduler, limit = self.scheduler, self.scheduler.config.max_num_seqs
        live = len(scheduler.running) + len(scheduler.waiting) + len(self.reservations)
        if live < limit:
            return None
        return Refusal(f"no free slot: {len(scheduler.running)} running, {len(scheduler.waiting)} waiting and "
                       f"{len(self.reservations)} granted requests fill max_num_seqs {limit}")

    def no_room(self, request_id: str, needed: int) -> Refusal | None:
        """A refusal when the free blocks, less those kept for the running and granted requests
        (:meth:`kept_blocks`) and those the oldest refused request still asking needs (unless that is
        ``request_id``), are fewer than ``needed``."""
        free, keep = self.kv.num_free_blocks, self.kept_blocks()
        waiter = self.waiters.protected(request_id)
        while waiter is not None and self.clock() - waiter.first_refused > self.max_protected_s:
            self.waiters.forget(waiter.request_id)  # it had its turn's length: to the back of the line
            waiter = self.waiters.protected(request_id)
        held = waiter.blocks_needed if waiter is not None else 0
        if free - keep - held >= needed:
            return None
        older = f" and {held} for {waiter.request_id!r}, which has waited longer" if waiter is not None else ""
        return Refusal(f"no room: {free} free blocks, {keep} kept for running requests{older}, {needed} needed")

    def kept_blocks(self) -> int:
        """Free blocks a new grant may not take: the admission policy's headroom for the running requests
        and those already granted (they decode here soon), plus what the waiting ones need to resume."""
        promised = [r.request for r in self.reservations.values()]
        return self.scheduler.headroom_blocks(extra=promised) + self._owed_to_waiting()

    def _owed_to_waiting(self) -> int:
        return sum(math.ceil((r.num_tokens + 1) / self.kv.block_size) for r in self.scheduler.waiting)

    def get(self, request_id: str) -> Reservation:
        reservation = self.reservations.get(request_id)
        if reservation is None:
            raise LeaseExpiredError(f"no reservation for {request_id!r} (expired, aborted or never granted)")
        return reservation

    def receive(self, request_id: str, block_ids: list[int]) -> Reservation:
        """Check that ``block_ids`` are granted, uncached and new; mark them received; renew the lease.
        The caller writes the bytes (outside the engine thread is fine: nothing else touches them)."""
        reservation = self.get(request_id)
        if len(set(block_ids)) != len(block_ids):
            raise InvalidRequestError("block_ids", f"a batch of {request_id!r} names a block twice")
        allowed = set(reservation.block_ids[reservation.num_cached_blocks:])
        for block_id in block_ids:
            if block_id not in allowed:
                raise InvalidRequestError("block_ids", f"block {block_id} is not one of {request_id!r}'s granted "
                                                       f"uncached blocks")
            if block_id in reservation.received:
                raise InvalidRequestError("block_ids", f"block {block_id} of {request_id!r} was already sent")
        reservation.received.update(block_ids)
        return self.renew(request_id)

    def renew(self, request_id: str) -> Reservation:
        """The prefill node still works on the request (a keepalive): push the lease deadline out."""
        reservation = self.get(request_id)
        reservation.lease_deadline = self.clock() + reservation.lease_s
        return reservation

    def unreceive(self, request_id: str, block_ids: list[int]) -> None:
        """Undo :meth:`receive` for blocks whose bytes never arrived (so they may be sent again); nothing
        to undo when the reservation is gone."""
        reservation = self.reservations.get(request_id)
        if reservation is not None:
            reservation.received.difference_update(block_ids)

    def commit(self, request_id: str, first_token_id: int) -> Request:
        reservation = self.get(request_id)
        if reservation.pending_block_ids:
            raise IncompleteTransferError(
                f"{request_id!r}: commit before blocks {reservation.pending_block_ids[:8]} arrived")
        del self.reservations[request_id]
        request = reservation.request
        request.num_computed_tokens = request.num_prompt_tokens
        request.append_output(first_token_id)
        self.kv.cache_computed(request_id, request.token_ids, request.num_computed_tokens)
        self.scheduler.add_prefilled(request)
        return request

    def cancel(self, request_id: str) -> bool:
        self.waiters.forget(request_id)  # aborted while waiting for room: it asks no more
        reservation = self.reservations.pop(request_id, None)
        if reservation is None:
            return False
        self.kv.free(request_id)
        return True

    def expire(self, busy: frozenset[str] = frozenset()) -> list[str]:
        """Cancel the reservations whose lease passed; those in ``busy`` (their bytes being written into
        their blocks right now, off this thread) wait for a later call. Their ids."""
        now = self.clock()
        expired = [rid for rid, r in self.reservations.items() if r.lease_deadline < now and rid not in busy]
        for rid in expired:
            self.cancel(rid)
        return expired

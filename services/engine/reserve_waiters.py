"""Fairness between prefill nodes' ``Reserve`` calls on a decode node: the oldest refused request still
asking gets its blocks kept for it.

A decode node grants a reservation to whichever request asks when enough blocks are free. Without a
memory of who asked before, a large prompt refused for room loses every later race: blocks come free a
few at a time, and each time a small request that arrived after it asks first (its prefill node backs off
up to 500 ms between tries) and takes them. A hunt measured a 179-token prompt starved for 52 s behind
76 small requests that came after it (5 s when idle), some past their 30 s reservation timeout.

:class:`ReserveWaiters` remembers each request refused for room (by id: its prefill node retries under the
same id) with the time of its first refusal. The oldest one that is still asking — refused again within
``present_s`` (5 s: a prefill node tries one decode node for 2 s, ``--prepare-wait-ms``, before the next,
so a request that went to one other node and came back still counts; one that gave up or was aborted
stops counting within that, or at once on an abort) — is *protected*: the blocks it needs are kept from
every other grant (and adoption), so they accumulate for it as running requests finish. Only the oldest
is protected, and only its own need is held: while it does not fit, requests that would eat into those
blocks wait behind it (first come first served at the head of the line, as vLLM's scheduler does), and
smaller ones still fit in the rest. Records are forgotten once granted or aborted, or ``forget_s`` after
their last refusal (a request visiting other decode nodes keeps its age when it comes back); at most
``max_records`` are kept.

Torch-free; runs on the engine thread with the reservation book.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Waiter:
    request_id: str
    first_refused: float
    last_refused: float
    blocks_needed: int


class ReserveWaiters:
    def __init__(self, present_s: float = 5.0, forget_s: float = 30.0, max_records: int = 4096,
                 clock: Callable[[], float] = time.monotonic):
        self.present_s = present_s
        self.forget_s = forget_s
        self.max_records = max_records
        self.clock = clock
        self._waiters: OrderedDict[str, Waiter] = OrderedDict()  # by first refusal, oldest first

    def __len__(self) -> int:
        return len(self._waiters)

    def refused(self, request_id: str, blocks_needed: int) -> None:
        """``request_id`` was refused for want of ``blocks_needed`` blocks (again, or for the first time)."""
        now = self.clock()
        waiter = self._waiters.get(request_id)
        if waiter is not None:
            waiter.last_refused, waiter.blocks_needed = now, blocks_needed
        elif len(self._waiters) < self.max_records:
            self._waiters[request_id] = Waiter(request_id, now, now, blocks_needed)

    def forget(self, request_id: str) -> None:
        """Granted, aborted or gone: no longer waiting."""
        self._waiters.pop(request_id, None)

    def protected(self, request_id: str | None = None) -> Waiter | None:
        """The oldest waiter still asking whose blocks ``request_id`` may not take: None when there is
        none, or ``request_id`` is that waiter itself."""
        now = self.clock()
        found: Waiter | None = None
        stale = []
        for waiter in self._waiters.values():  # oldest first
            if now - waiter.last_refused > self.forget_s:
                stale.append(waiter.request_id)  # nobody asked for it in a long while
            elif found is None and (waiter.request_id == request_id or now - waiter.last_refused <= self.present_s):
                found = waiter
        for rid in stale:
            del self._waiters[rid]
        return None if found is None or found.request_id == request_id else found

"""Leases: a Get pins the blocks it streams so that eviction (in either tier) skips them.

A lease ends when its stream ends (:meth:`Leases.release`), or at the latest ``lease_s`` after it was
taken (when its Get began), however the stream moves: the safety expiry for a stream whose end was never
seen, and the most any reader can hold blocks. It is not renewed as blocks are served — it used to be, and a
reader taking one block per ``lease_s`` (a node reading slowly, or a stalled one) then kept every block of
its Get pinned indefinitely, so every other caller's puts failed ``RESOURCE_EXHAUSTED``. A Get still
streaming past it goes on unpinned: a block evicted before the stream reaches it is a missing block.

What a lease pins: every key of the Get against disk eviction (:meth:`Leases.pinned`), and against memory
eviction only the keys that were in memory when it was taken (:meth:`Leases.pinned_in_memory`; a block
the Get promotes from disk keeps its disk copy, so its memory copy may go). Each lease names its caller and
the memory bytes it pins (:meth:`Leases.held_by`): the store bounds what one caller's live leases may hold
together (``BlockStore.lease_share_bytes``, half the memory tier), so one node identity can never hold more
than half the tier from the others' puts.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass


@dataclass
class Lease:
    id: int
    keys: tuple[bytes, ...]
    expires_at: float
    memory_keys: frozenset[bytes] | None = None  # pinned in memory too (None: all of ``keys``)
    caller: str | None = None  # None: not bounded per caller (the store's own reads, tests)
    nbytes: int = 0  # data bytes of ``memory_keys``, counted against the caller's share


class Leases:
    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        assert lease_s > 0, f"lease_s must be positive, got {lease_s}"
        self.lease_s = lease_s
        self.clock = clock
        self._leases: dict[int, Lease] = {}
        self._ids = itertools.count()
        self.expired_total = 0

    def __len__(self) -> int:
        """Leases held now (expired ones included until :meth:`pinned` or :meth:`held_by` drops them)."""
        return len(self._leases)

    def acquire(self, keys: Sequence[bytes], memory_keys: Collection[bytes] | None = None, caller: str | None = None,
                nbytes: int = 0) -> Lease:
        """A lease on ``keys`` (in memory: on ``memory_keys``, default all) until released, or ``lease_s``
        from now at the latest."""
        lease = Lease(next(self._ids), tuple(keys), self.clock() + self.lease_s,
                      None if memory_keys is None else frozenset(memory_keys), caller, nbytes)
        self._leases[lease.id] = lease
        return lease

    def release(self, lease: Lease) -> None:
        self._leases.pop(lease.id, None)

    def pinned(self) -> set[bytes]:
        """Keys held by a live lease (what disk eviction and Delete skip); expired leases are dropped (and
        counted) here."""
        self._expire()
        return {key for lease in self._leases.values() for key in lease.keys}

    def pinned_in_memory(self) -> set[bytes]:
        """Keys a live lease holds in memory (what memory eviction skips)."""
        self._expire()
        return {key for lease in self._leases.values()
                for key in (lease.keys if lease.memory_keys is None else lease.memory_keys)}

    def held_by(self, caller: str) -> int:
        """Memory bytes ``caller``'s live leases pin (a block two of its Gets lease counts twice)."""
        self._expire()
        return sum(lease.nbytes for lease in self._leases.values() if lease.caller == caller)

    def _expire(self) -> None:
        now = self.clock()
        for lease in [lease for lease in self._leases.values() if lease.expires_at <= now]:
            del self._leases[lease.id]
            self.expired_total += 1

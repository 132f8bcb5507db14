"""Leases: a Get pins the blocks it streams so that eviction (in either tier) skips them.

A lease ends when its stream ends (:meth:`Leases.release`), or at the latest ``lease_s`` after the last
block it served (:meth:`Lease.renew`): the safety expiry for a stream whose end was never seen.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Lease:
    id: int
    keys: tuple[bytes, ...]
    expires_at: float


class Leases:
    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        assert lease_s > 0, f"lease_s must be positive, got {lease_s}"
        self.lease_s = lease_s
        self.clock = clock
        self._leases: dict[int, Lease] = {}
        self._ids = itertools.count()
        self.expired_total = 0

    def __len__(self) -> int:
        """Leases held now (expired ones included until :meth:`pinned` drops them)."""
        return len(self._leases)

    def acquire(self, keys: Sequence[bytes]) -> Lease:
        lease = Lease(next(self._ids), tuple(keys), self.clock() + self.lease_s)
        self._leases[lease.id] = lease
        return lease

    def renew(self, lease: Lease) -> None:
        if lease.id in self._leases:
            lease.expires_at = self.clock() + self.lease_s

    def release(self, lease: Lease) -> None:
        self._leases.pop(lease.id, None)

    def pinned(self) -> set[bytes]:
        """Keys held by a live lease; expired leases are dropped (and counted) here."""
        now = self.clock()
        for lease in [lease for lease in self._leases.values() if lease.expires_at <= now]:
            del self._leases[lease.id]
            self.expired_total += 1
        return {key for lease in self._leases.values() for key in lease.keys}

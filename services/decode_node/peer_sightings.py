"""Decode nodes a gateway counts healthy, as its status polls tell this decode node
(``NodeStatusRequest.decode_nodes``), with when each was last named.

A request's own peers (``Route``) are the decode candidates its prefill node listed at ``Reserve``: a node
that joined later (the new pod of a rolling update) is not among them. Migration (``migration.py``) offers a
request to its own peers first, then to the nodes the gateways named within ``fresh_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from services.decode_node.handover import Route


class PeerSightings:
    def __init__(self, fresh_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.fresh_s = fresh_s
        self.clock = clock
        self._seen: dict[str, float] = {}

    def saw(self, addresses: Iterable[str]) -> None:
        now = self.clock()
        for address in addresses:
            self._seen[address] = now

    def fresh(self) -> list[str]:
        """The nodes named within ``fresh_s``, the most recently named first."""
        now = self.clock()
        self._seen = {a: t for a, t in self._seen.items() if now - t <= self.fresh_s}
        return sorted(self._seen, key=lambda a: -self._seen[a])

    def widen(self, route: Route, me: str) -> Route:
        """``route`` with the fresh nodes it lacks appended (``me``, this node, left out)."""
        peers = list(dict.fromkeys([*route.peers, *self.fresh()]))
        return Route([p for p in peers if p and p != me], route.deadline_unix_ms)

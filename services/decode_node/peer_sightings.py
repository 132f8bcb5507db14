"""Decode nodes a gateway counts healthy, as its status polls tell this decode node
(``NodeStatusRequest.decode_nodes``), with when each was last named.

A request's own peers (``Route``) are the decode candidates its prefill node listed at ``Reserve``: a node
that joined later (the new pod of a rolling update) is not among them. Migration (``migration.py``) offers a
request to its own peers first, then to the nodes the gateways named within ``fresh_s``.

At most ``max_peers`` addresses are remembered (the most recently named; stale ones are dropped as new
ones come): a caller naming thousands of addresses, poll after poll, cannot grow this node's memory or
make a drain offer requests to thousands of nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from services.decode_node.handover import Route


class PeerSightings:
    def __init__(self, fresh_s: float = 60.0, clock: Callable[[], float] = time.monotonic, max_peers: int = 256):
        self.fresh_s = fresh_s
        self.clock = clock
        self.max_peers = max_peers
        self._seen: dict[str, float] = {}  # in the order last named: the oldest first

    def saw(self, addresses: Iterable[str]) -> None:
        now = self.clock()
        for address in addresses:
            self._seen.pop(address, None)
            self._seen[address] = now
        while len(self._seen) > self.max_peers:
            del self._seen[next(iter(self._seen))]

    def fresh(self) -> list[str]:
        """The nodes named within ``fresh_s``, the most recently named first."""
        now = self.clock()
        self._seen = {a: t for a, t in self._seen.items() if now - t <= self.fresh_s}
        return sorted(self._seen, key=lambda a: -self._seen[a])

    def __len__(self) -> int:
        return len(self._seen)

    def widen(self, route: Route, me: str) -> Route:
        """``route`` with the fresh nodes it lacks appended (``me``, this node, left out)."""
        peers = list(dict.fromkeys([*route.peers, *self.fresh()]))
        return Route([p for p in peers if p and p != me], route.deadline_unix_ms)

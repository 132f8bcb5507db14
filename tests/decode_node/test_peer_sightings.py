"""The decode nodes the gateways' polls name (migration targets): fresh ones first, stale ones forgotten, and
at most ``max_peers`` kept however many a caller names. Pure logic, a fake clock."""

from __future__ import annotations

from services.decode_node.handover import Route
from services.decode_node.peer_sightings import PeerSightings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_most_recently_named_come_first_and_stale_ones_are_dropped() -> None:
    clock = Clock()
    peers = PeerSightings(fresh_s=60, clock=clock)
    peers.saw(["a:1", "b:1"])
    clock.now = 30
    peers.saw(["c:1", "a:1"])
    assert peers.fresh()[0] in ("c:1", "a:1") and set(peers.fresh()) == {"a:1", "b:1", "c:1"}
    clock.now = 61
    assert set(peers.fresh()) == {"a:1", "c:1"}  # b was last named 61 s ago
    assert peers.widen(Route(["x:1", "c:1"], 0), me="a:1").peers == ["x:1", "c:1"]


def test_a_flood_of_names_keeps_only_the_newest_max_peers() -> None:
    """300 polls naming 64 new addresses each left 19,200 entries (all of them migration targets)."""
    clock = Clock()
    peers = PeerSightings(clock=clock, max_peers=256)
    peers.saw(["keep:1"])
    for poll in range(300):
        clock.now += 0.001
        peers.saw([f"bogus-{poll}-{i}:1" for i in range(64)])
        peers.saw(["keep:1"])  # named by every poll: never the oldest
    assert len(peers) == 256
    assert "keep:1" in peers.fresh() and "bogus-0-0:1" not in peers.fresh()
    assert "bogus-299-63:1" in peers.fresh()

"""Choosing the nodes of a request: a prefill node by load, decode candidates by free blocks then load.

Pure logic over ``NodeInfo`` snapshots (no I/O): unhealthy nodes are never chosen, and ties rotate
round robin so equally loaded nodes share a burst of requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.errors import UnavailableError
from services.gateway.kv_compatibility import compatible
from services.gateway.nodes import DECODE, PREFILL, NodeInfo


class NoHealthyNodeError(UnavailableError):
    """No node of a role is healthy (maps to ``UNAVAILABLE``)."""

    def __init__(self, role: str, known: Sequence[NodeInfo]):
        """``known``: the nodes of ``role``, each with the reason it is not healthy."""
        reasons = "; ".join(f"{n.address}: {n.error or 'not healthy'}" for n in known[:3])
        more = f"; {len(known) - 3} more" if len(known) > 3 else ""
        super().__init__(f"no healthy {role} node ({len(known)} known{': ' + reasons + more if known else ''})")
        self.role = role


@dataclass(frozen=True)
class Route:
    prefill: str
    decode_candidates: tuple[str, ...]  # best first; the prefill node tries them in order


class Router:
    def __init__(self) -> None:
        self._turn = 0

    def route(self, prefill_nodes: Sequence[NodeInfo], decode_nodes: Sequence[NodeInfo]) -> Route:
        """A prefill node and the ordered decode candidates whose KV layout matches it;
        ``NoHealthyNodeError`` if either is empty."""
        prefill = self.pick_prefill(prefill_nodes)
        chosen = next(n for n in prefill_nodes if n.address == prefill)
        matching = [n for n in decode_nodes if compatible(chosen, n)]
        # none healthy: the error names every decode node (through directory.nodes() a healthy prefill node
        # always has a healthy match, so no mismatched node is routed to)
        decode = self.order_decode(matching if any(n.healthy for n in matching) else decode_nodes)
        self._turn += 1
        return Route(prefill, decode)

    def pick_prefill(self, nodes: Sequence[NodeInfo]) -> str:
        """The least loaded healthy prefill node (running + waiting); ties rotate."""
        healthy = _healthy(nodes, PREFILL)
        least = min(n.load for n in healthy)
        tied = [n for n in healthy if n.load == least]
        return tied[self._turn % len(tied)].address

    def order_decode(self, nodes: Sequence[NodeInfo]) -> tuple[str, ...]:
        """Healthy decode nodes, most available blocks first, then least loaded; ties rotate."""
        healthy = _healthy(nodes, DECODE)
        shift = self._turn % len(healthy)
        rotated = healthy[shift:] + healthy[:shift]  # sorted() is stable: equal keys keep this order
        ranked = sorted(rotated, key=lambda n: (-n.available_blocks, n.load))
        return tuple(n.address for n in ranked)


def _healthy(nodes: Sequence[NodeInfo], role: str) -> list[NodeInfo]:
    healthy = sorted((n for n in nodes if n.healthy and n.role == role), key=lambda n: n.address)
    if not healthy:
        raise NoHealthyNodeError(role, known=[n for n in nodes if n.role == role])
    return healthy

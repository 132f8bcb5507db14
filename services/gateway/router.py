"""Choosing the nodes of a request.

- ``load``: the least loaded prefill node; decode candidates by available blocks, then load.
- ``cache_aware`` (the default, as SGLang's cache-aware policy and Dynamo's KV router): the prefill node
  holding the longest prefix of the prompt (``prefix_affinity.py``: an index of what the gateway routed),
  unless its load exceeds the least loaded node's by more than ``load_margin`` requests (then the least
  loaded, so a hot prefix cannot pile every request onto one node); decode candidates by held prefix
  (their reservations reuse cached blocks, so less KV travels), then available blocks, then load.

Pure logic over ``NodeInfo`` snapshots (no I/O): unhealthy nodes are never chosen, and ties rotate
round robin so equally loaded nodes share a burst of requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.errors import UnavailableError
from services.gateway.kv_compatibility import compatible
from services.gateway.nodes import DECODE, PREFILL, NodeInfo
from services.gateway.prefix_affinity import DEFAULT_BLOCK_SIZE, PrefixAffinity, block_hashes

ROUTING_POLICIES = ("cache_aware", "load")
UNKNOWN_CAPACITY_BLOCKS = 1 << 16  # a node that has not said its pool size yet


class NoHealthyNodeError(UnavailableError):
    """No node of a role is healthy (maps to ``UNAVAILABLE``). Its message, which reaches clients, counts
    the nodes but names none of them nor why they are left out (another model's name and weights digest, KV
    layout fingerprints, resolver errors): ``reasons`` keeps that for the gateway's own use; the directory
    logs each node it leaves out, and ``ClusterStatus`` shows every node's error to operators."""

    def __init__(self, role: str, known: Sequence[NodeInfo]):
        """``known``: the nodes of ``role``, each with the reason it is not healthy."""
        super().__init__(f"no healthy {role} node ({len(known)} known; the gateway's log and ClusterStatus "
                         "say why)" if known else f"no healthy {role} node (none known)")
        self.role = role
        self.reasons = [f"{n.address}: {n.error or 'not healthy'}" for n in known]


@dataclass(frozen=True)
class Route:
    prefill: str
    decode_candidates: tuple[str, ...]  # best first; the prefill node tries them in order


class Router:
    def __init__(self, policy: str = "cache_aware", load_margin: int = 16) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {', '.join(ROUTING_POLICIES)}, got {policy!r}")
        self.policy = policy
        self.load_margin = load_margin
        self.affinity = PrefixAffinity()
        self._turn = 0

    def route(self, prefill_nodes: Sequence[NodeInfo], decode_nodes: Sequence[NodeInfo],
              prompt_ids: Sequence[int] = ()) -> Route:
        """A prefill node and the ordered decode candidates whose KV layout matches it;
        ``NoHealthyNodeError`` if either is empty. With ``cache_aware``, the prompt's blocks are then
        recorded as held by the chosen prefill node and the first decode candidate."""
        hashes = self._hashes(prefill_nodes, prompt_ids)
        prefill = self.pick_prefill(prefill_nodes, hashes)
        chosen = next(n for n in prefill_nodes if n.address == prefill)
        matching = [n for n in decode_nodes if compatible(chosen, n)]
        # none healthy: the error names every decode node (through directory.nodes() a healthy prefill node
        # always has a healthy match, so no mismatched node is routed to)
        decode = self.order_decode(matching if any(n.healthy for n in matching) else decode_nodes, hashes)
        self._turn += 1
        if hashes:
            for node in (chosen, next(n for n in decode_nodes if n.address == decode[0])):
                self.affinity.record(node.address, hashes, node.blocks_total or UNKNOWN_CAPACITY_BLOCKS)
        return Route(prefill, decode)

    def route_prefill_only(self, prefill_nodes: Sequence[NodeInfo], prompt_ids: Sequence[int] = ()) -> str:
        """The prefill node of a request that needs no decode node (an embedding), picked as :meth:`route` picks
        it (ties rotate across calls); with ``cache_aware``, the prompt's blocks are then recorded as held there."""
        hashes = self._hashes(prefill_nodes, prompt_ids)
        prefill = self.pick_prefill(prefill_nodes, hashes)
        self._turn += 1
        if hashes:
            chosen = next(n for n in prefill_nodes if n.address == prefill)
            self.affinity.record(prefill, hashes, chosen.blocks_total or UNKNOWN_CAPACITY_BLOCKS)
        return prefill

    def _hashes(self, nodes: Sequence[NodeInfo], prompt_ids: Sequence[int]) -> tuple[int, ...]:
        if self.policy != "cache_aware" or not prompt_ids:
            return ()
        block_size = next((n.block_size for n in nodes if n.block_size), DEFAULT_BLOCK_SIZE)
        return block_hashes(prompt_ids, block_size)

    def pick_prefill(self, nodes: Sequence[NodeInfo], hashes: Sequence[int] = ()) -> str:
        """The healthy prefill node holding the longest prefix of the prompt, among those within
        ``load_margin`` of the least loaded; with none holding any, the least loaded (running + waiting).
        Ties rotate."""
        healthy = _healthy(nodes, PREFILL)
        least = min(n.load for n in healthy)
        held = {n.address: self.affinity.matched_blocks(n.address, hashes) for n in healthy} if hashes else {}
        near = [n for n in healthy if n.load <= least + self.load_margin]
        best = max((held.get(n.address, 0) for n in near), default=0)
        if best > 0:
            tied = [n for n in near if held[n.address] == best]
            fewest = min(n.load for n in tied)
            tied = [n for n in tied if n.load == fewest]
        else:
            tied = [n for n in healthy if n.load == least]
        return tied[self._turn % len(tied)].address

    def order_decode(self, nodes: Sequence[NodeInfo], hashes: Sequence[int] = ()) -> tuple[str, ...]:
        """Healthy decode nodes: the longest held prefix first (cache_aware; only among nodes within
        ``load_margin`` of the least loaded, so a hot prefix does not pile onto one node), then most
        available blocks, then least loaded; ties rotate."""
        healthy = _healthy(nodes, DECODE)
        shift = self._turn % len(healthy)
        rotated = healthy[shift:] + healthy[:shift]  # sorted() is stable: equal keys keep this order
        least = min(n.load for n in healthy)
        held = {n.address: self.affinity.matched_blocks(n.address, hashes) for n in healthy
                if n.load <= least + self.load_margin} if hashes else {}
        ranked = sorted(rotated, key=lambda n: (-held.get(n.address, 0), -n.available_blocks, n.load))
        return tuple(n.address for n in ranked)


def _healthy(nodes: Sequence[NodeInfo], role: str) -> list[NodeInfo]:
    healthy = sorted((n for n in nodes if n.healthy and n.role == role), key=lambda n: n.address)
    if not healthy:
        raise NoHealthyNodeError(role, known=[n for n in nodes if n.role == role])
    return healthy

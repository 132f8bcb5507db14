"""Which prefill and decode nodes can work together: a prefill node's KV is usable only by a decode node
with the same KV layout (model fingerprint, dtype, block size, shapes), which each reports as
``NodeStatus.kv_layout_id``.

A node restarted with another model or dtype would otherwise stay in rotation: a prefill node nobody can
take KV from fails every request it is given (and, idle, it looks the least loaded), and a decode node no
prefill node can send to is tried first for every request (it looks the emptiest). Such a node is reported
unhealthy, saying why; and the decode candidates of a request are those that match its prefill node.
A node that reports no id (empty) matches any.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from services.gateway.nodes import DECODE, PREFILL, NodeInfo

_PEER_ROLE = {PREFILL: DECODE, DECODE: PREFILL}
MISMATCH = "its KV layout"  # how the error of a node left out for its KV layout starts


def compatible(a: NodeInfo, b: NodeInfo) -> bool:
    return not a.kv_layout_id or not b.kv_layout_id or a.kv_layout_id == b.kv_layout_id


def with_kv_compatibility(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    """``nodes``, with each healthy model node whose KV layout no healthy node of the other role has
    reported unhealthy (when there is a healthy node of that role at all)."""
    ids = {role: {n.kv_layout_id for n in nodes if n.role == role and n.healthy} for role in _PEER_ROLE}
    marked = []
    for node in nodes:
        peers = ids.get(_PEER_ROLE.get(node.role, ""), set())
        if node.healthy and node.kv_layout_id and peers and "" not in peers and node.kv_layout_id not in peers:
            other = _PEER_ROLE[node.role]
            node = dataclasses.replace(node, healthy=False, error=(
                f"{MISMATCH} {node.kv_layout_id} matches no healthy {other} node's ({', '.join(sorted(peers))}): "
                f"another model, dtype or block size"))
        marked.append(node)
    return marked

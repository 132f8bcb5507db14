"""Whether a model node runs in the gateway's numerics mode: a cluster serves batch-invariant
(``--deterministic``: a request's tokens do not depend on the load) or not, never both. A request that
landed on a node of the other mode would silently lose (or gain) that guarantee, and the two modes' KV is
not interchangeable. Each model node reports its mode (``NodeStatus.deterministic``); a node whose mode
differs from the gateway's own ``--deterministic`` is unhealthy, saying both modes, and never routed to.
A node that does not report the field (an older one) reads as off: it has no batch-invariant mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from services.gateway.nodes import DECODE, PREFILL, NodeInfo

MISMATCH = "deterministic mode"  # how the error of a node left out for its mode starts


def _mode(deterministic: bool) -> str:
    return "on" if deterministic else "off"


def with_mode_check(nodes: Sequence[NodeInfo], deterministic: bool) -> list[NodeInfo]:
    """``nodes``, with each healthy prefill or decode node whose ``deterministic`` differs from the
    gateway's reported unhealthy."""
    return [node if node.role not in (PREFILL, DECODE) or not node.healthy or node.deterministic == deterministic
            else dataclasses.replace(node, healthy=False, error=(
                f"{MISMATCH}: the node runs {_mode(node.deterministic)}, this gateway expects "
                f"{_mode(deterministic)} (--deterministic); start the gateway and every node in one mode"))
            for node in nodes]

"""Log once each node that starts (or stops) being left out of rotation for what it serves: another
model than the gateway's (``model_check``), another numerics mode (``mode_check``) or a KV layout no peer
has (``kv_compatibility``)."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from services.gateway.kv_compatibility import MISMATCH as KV_MISMATCH
from services.gateway.mode_check import MISMATCH as MODE_MISMATCH
from services.gateway.model_check import MISMATCH as MODEL_MISMATCH
from services.gateway.nodes import NodeInfo

log = structlog.get_logger(__name__)

_EVENTS = {MODEL_MISMATCH: "node left out: it serves another model than the gateway's",
           MODE_MISMATCH: "node left out: its deterministic mode differs from the gateway's",
           KV_MISMATCH: "node left out: its KV layout matches no peer"}


def _event(error: str) -> str:
    return next((event for prefix, event in _EVENTS.items() if error.startswith(prefix)), "")


class LeftOutLog:
    def __init__(self) -> None:
        self._left: dict[str, str] = {}  # address → the event it was last logged under

    def update(self, nodes: Sequence[NodeInfo]) -> None:
        now = {n.address: (_event(n.error), n.error) for n in nodes if not n.healthy and _event(n.error)}
        healthy = {n.address for n in nodes if n.healthy}
        for address, (event, error) in now.items():
            if self._left.get(address) != event:
                log.warning(event, address=address, error=error)
        for address in (self._left.keys() - now.keys()) & healthy:  # not one that failed or left
            log.info("node back in rotation: it serves the gateway's model in its mode, its KV layout matches "
                     "its peers", address=address)
        self._left = {address: event for address, (event, _) in now.items()}

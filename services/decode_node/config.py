"""Decode-node settings: ``--flag`` or ``PDSERVE_*`` variable per field (see services.common.config)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import setting
from services.common.engine_node import EngineNodeConfig


@dataclass(frozen=True)
class DecodeNodeConfig(EngineNodeConfig):
    """pdserve decode node: grants KV reservations, receives prompt KV, decodes with continuous batching."""

    listen: str = setting("127.0.0.1:50053", "host:port to serve on; port 0 = ephemeral")
    lease_ms: int = setting(10_000, "how long a reservation holds without KV traffic (caps what prefill asks)")

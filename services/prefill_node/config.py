"""Prefill-node settings: ``--flag`` or ``PDSERVE_*`` variable per field (see services.common.config)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import setting
from services.common.engine_node import EngineNodeConfig


@dataclass(frozen=True)
class PrefillNodeConfig(EngineNodeConfig):
    """pdserve prefill node: reserves KV on a decode node, prefills in chunks, streams the KV there."""

    listen: str = setting("127.0.0.1:50052", "host:port to serve on; port 0 = ephemeral")
    max_num_batched_tokens: int = setting(512, "tokens per step (the prefill chunk)")
    lease_ms: int = setting(10_000, "lease asked of decode nodes for a reservation")

"""Prefill-node settings: ``--flag`` or ``PDSERVE_*`` variable per field (see services.common.config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from services.common.config import setting
from services.engine.config import EngineConfig
from services.engine_node.node_config import EngineNodeConfig
from services.prefill_node.prepare import PrepareSettings


@dataclass(frozen=True)
class PrefillNodeConfig(EngineNodeConfig):
    """pdserve prefill node: reserves KV on a decode node, prefills in chunks, streams the KV there."""

    listen: str = setting("127.0.0.1:50052", "host:port to serve on; port 0 = ephemeral")
    max_num_batched_tokens: int = setting(512, "tokens per step (the prefill chunk)")
    lease_ms: int = setting(10_000, "lease asked of decode nodes for a reservation")
    prepare_concurrency: int = setting(8, "Reserve calls in flight per decode node (the others queue)")
    prepare_backoff_ms: int = setting(20, "first retry delay after a refusal; doubles up to prepare-backoff-max-ms")
    prepare_backoff_max_ms: int = setting(500, "longest retry delay after a refusal")
    prepare_wait_ms: int = setting(2000, "longest a request keeps retrying one decode node before the next")
    prepare_timeout_ms: int = setting(30_000, "how long a request may wait for a decode node when its call "
                                              "has no deadline")
    cache_store: str = setting("", "cache-store host:port: prompt blocks missing here are fetched from it, computed "
                                   "ones written back (empty: off)")
    cache_store_timeout_ms: int = setting(5000, "longest one cache-store call may take; past it the prompt's "
                                                "blocks are computed here instead")
    cache_store_write_through: bool = setting(True, "write the prompt blocks computed here to the cache-store")
    cache_store_writeback_mib: int = setting(256, "cap on write-back bytes in flight (past it a write-back is "
                                                  "dropped)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prepare_concurrency < 1:
            raise ValueError(f"prepare_concurrency must be >= 1, got {self.prepare_concurrency}")
        if min(self.prepare_backoff_ms, self.prepare_backoff_max_ms, self.prepare_wait_ms,
               self.prepare_timeout_ms, self.cache_store_timeout_ms) <= 0:
            raise ValueError("prepare_backoff_ms, prepare_backoff_max_ms, prepare_wait_ms, prepare_timeout_ms and "
                             "cache_store_timeout_ms must be > 0")

    def engine_config(self) -> EngineConfig:
        """The engine's settings; ``--cuda-graphs`` is accepted (one value for both roles) but captures
        nothing here: a prefill node runs no decode-only step."""
        return dataclasses.replace(super().engine_config(), cuda_graphs=False)

    def prepare_settings(self) -> PrepareSettings:
        return PrepareSettings(concurrency=self.prepare_concurrency, wait_s=self.prepare_wait_ms / 1000,
                               backoff_s=self.prepare_backoff_ms / 1000,
                               backoff_max_s=max(self.prepare_backoff_max_ms, self.prepare_backoff_ms) / 1000,
                               timeout_s=self.prepare_timeout_ms / 1000)

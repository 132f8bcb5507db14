"""Decode-node settings: ``--flag`` or ``PDSERVE_*`` variable per field (see services.common.config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from services.common.config import setting
from services.engine.config import EngineConfig
from services.engine_node.node_config import EngineNodeConfig


@dataclass(frozen=True)
class DecodeNodeConfig(EngineNodeConfig):
    """pdserve decode node: grants KV reservations, receives prompt KV, decodes with continuous batching."""

    listen: str = setting("127.0.0.1:50053", "host:port to serve on; port 0 = ephemeral")
    lease_ms: int = setting(10_000, "how long a reservation holds without KV traffic (caps what prefill asks)")
    state_checkpoints: int = setting(0, "a hybrid model's prefix cache: checkpoints of the recurrent state kept, each "
                                        "one request's state, out of kv_cache_gib (prompts are computed on prefill "
                                        "nodes: here only a preempted request's recompute saves and uses one; -1: a "
                                        "quarter of max_num_seqs)")
    handover_after_ms: int = setting(300, "hand a preempted request whose KV is in the cache-store to another decode "
                                          "node once it waited this long here (0: never)")
    max_reservations_per_caller: int = setting(256, "live reservations (granted, not yet committed, aborted or "
                                                    "expired) one caller (certificate common name) may hold; "
                                                    "past it Reserve answers granted=false naming the bound")
    max_reserved_blocks_per_caller_fraction: float = setting(0.5, "fraction of the KV pool, and of max_num_seqs, "
                                                                  "one caller may hold in live reservations; past "
                                                                  "it Reserve answers granted=false naming the "
                                                                  "bound")
    reattach_grace_s: float = setting(30.0, "a request whose Attach call ended before it did (the gateway stood "
                                            "still, its connection broke) runs on this long waiting for the "
                                            "gateway to attach again and resume, then is aborted")
    cache_outputs: bool = setting(False, "write finished requests' full KV blocks (prompt and output) to the "
                                         "offload cache-store under their content keys")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lease_ms < 1:
            raise ValueError(f"lease_ms must be >= 1, got {self.lease_ms}")
        if self.handover_after_ms < 0:
            raise ValueError(f"handover_after_ms must be >= 0, got {self.handover_after_ms}")
        if self.max_reservations_per_caller < 1:
            raise ValueError(f"max_reservations_per_caller must be >= 1, got {self.max_reservations_per_caller}")
        if not 0 < self.max_reserved_blocks_per_caller_fraction <= 1:
            raise ValueError("max_reserved_blocks_per_caller_fraction must be in (0, 1], got "
                             f"{self.max_reserved_blocks_per_caller_fraction}")
        if self.reattach_grace_s <= 0:
            raise ValueError(f"reattach_grace_s must be > 0, got {self.reattach_grace_s}")
        if self.cache_outputs and not self.offload_cache_store:
            raise ValueError("cache_outputs needs --offload-cache-store")

    def engine_config(self) -> EngineConfig:
        return dataclasses.replace(super().engine_config(), cache_outputs=self.cache_outputs)

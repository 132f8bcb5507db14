"""Cache-store settings: ``--flag`` or ``PDSERVE_*`` variable per field (see services.common.config)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import setting
from services.common.server import ServerConfig

MIB = 1 << 20


@dataclass(frozen=True)
class CacheStoreConfig(ServerConfig):
    """pdserve cache-store: content-addressed KV blocks in memory, LRU-evicted past a byte capacity."""

    listen: str = setting("127.0.0.1:50054", "host:port to serve on; port 0 = ephemeral")
    capacity_bytes: int = setting(1 << 30, "memory budget for block bytes")
    chunk_bytes: int = setting(2 * MIB, "data bytes per Get message (1-4 MiB advised)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {self.capacity_bytes}")
        if not 0 < self.chunk_bytes <= self.max_message_mib * MIB // 2:
            raise ValueError(f"chunk_bytes must be in (0, max_message_mib/2], got {self.chunk_bytes}")

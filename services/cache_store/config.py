"""Cache-store settings: ``--flag`` or ``PDSERVE_*`` variable per field (see services.common.config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.common.config import setting
from services.common.server_config import ServerConfig

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class CacheStoreConfig(ServerConfig):
    """pdserve cache-store: content-addressed KV blocks in memory and optionally on disk, LRU per tier."""

    listen: str = setting("127.0.0.1:50054", "host:port to serve on; port 0 = ephemeral")
    capacity_bytes: int = setting(GIB, "memory tier: budget for block bytes (also bounds unfinished puts and leases)")
    chunk_bytes: int = setting(2 * MIB, "data bytes per Get message (1-4 MiB advised)")
    disk_dir: Path | None = setting(None, "disk tier: directory of block files (none = memory only)")  # noqa: RUF009
    disk_capacity_bytes: int = setting(16 * GIB, "disk tier: budget for block bytes")
    disk_write_through: bool = setting(False, "every put writes its blocks to disk before it answers")
    lease_s: float = setting(30.0, "a Get's pin on the blocks it streams expires this long after the Get began")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {self.capacity_bytes}")
        if not 0 < self.chunk_bytes <= self.max_message_mib * MIB // 2:
            raise ValueError(f"chunk_bytes must be in (0, max_message_mib/2], got {self.chunk_bytes}")
        if self.disk_capacity_bytes <= 0:
            raise ValueError(f"disk_capacity_bytes must be > 0, got {self.disk_capacity_bytes}")
        if self.disk_write_through and self.disk_dir is None:
            raise ValueError("disk_write_through needs disk_dir")
        if self.lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {self.lease_s}")

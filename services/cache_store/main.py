"""``python -m services.cache_store``: config → store → servicer → server, until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog
from pdserve.v1 import cache_store_pb2

from services.cache_store.config import CacheStoreConfig
from services.cache_store.disk_tier import DiskTier
from services.cache_store.metrics import cache_store_registry
from services.cache_store.servicer import CacheStoreServicer, add_to_server
from services.cache_store.store import BlockStore
from services.common.bootstrap import run_service, serve_bound
from services.common.malloc import tune_malloc
from services.common.server import NodeServer, ServiceBinding

log = structlog.get_logger(__name__)


def build_store(config: CacheStoreConfig) -> BlockStore:
    disk = None
    if config.disk_dir is not None:
        try:
            disk = DiskTier(config.disk_dir, config.disk_capacity_bytes)
        except OSError as error:  # a file there, no permission: one line naming the flag (common.server.run)
            raise OSError(f"--disk-dir: {error}") from error
    return BlockStore(config.capacity_bytes, disk, write_through=config.disk_write_through, lease_s=config.lease_s)


async def serve(config: CacheStoreConfig) -> None:
    servicer = CacheStoreServicer(build_store(config), chunk_bytes=config.chunk_bytes)
    binding = ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer,
                             add_to_server)
    registry = cache_store_registry(servicer, asyncio.get_running_loop())
    server = NodeServer.from_config(config, [binding], drain=servicer.drain, registry=registry)
    disk = servicer.store.disk  # an empty disk tier is falsy (it has a length): compare with None
    await serve_bound(server, servicer, config.advertise, "cache-store ready", capacity_bytes=config.capacity_bytes,
                      disk_dir=str(disk.directory) if disk is not None else None,
                      disk_blocks=len(disk) if disk is not None else 0, write_through=config.disk_write_through)


def _tune_malloc() -> None:
    if not tune_malloc():
        log.info("malloc not tuned (not glibc)")


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(CacheStoreConfig, argv, module="services.cache_store", tracing_name="pdserve-cache-store",
                       serve=serve, role="cache-store", before_serve=_tune_malloc)

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
from services.common.config import build_config
from services.common.keepalive import set_keepalive
from services.common.logging import setup_logging
from services.common.malloc import tune_malloc
from services.common.server import NodeServer, ServiceBinding, run
from services.common.tracing import setup_tracing, shutdown_tracing

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
    await server.start()
    servicer.address = config.advertise or server.address
    servicer.metrics_url = server.metrics_url(servicer.address)
    disk = servicer.store.disk  # an empty disk tier is falsy (it has a length): compare with None
    log.info("cache-store ready", address=servicer.address, capacity_bytes=config.capacity_bytes,
             disk_dir=str(disk.directory) if disk is not None else None,
             disk_blocks=len(disk) if disk is not None else 0,
             write_through=config.disk_write_through, metrics=servicer.metrics_url)
    await server.serve_until_signalled()


def main(argv: Sequence[str] | None = None) -> int:
    config = build_config(CacheStoreConfig, argv, prog="python -m services.cache_store")
    setup_logging(config.log_level, config.log_format)
    set_keepalive(config.keepalive_s, config.keepalive_timeout_s)
    setup_tracing("pdserve-cache-store")  # OTEL_TRACES_EXPORTER unset: off
    if not tune_malloc():
        log.info("malloc not tuned (not glibc)")
    try:
        run(serve(config))
    finally:
        shutdown_tracing()  # after the drain: the last requests' spans are exported
    return 0

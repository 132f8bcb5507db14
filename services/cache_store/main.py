"""``python -m services.cache_store``: config → store → servicer → server, until SIGTERM/SIGINT."""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc

from services.cache_store.config import CacheStoreConfig
from services.cache_store.servicer import CacheStoreServicer
from services.cache_store.store import BlockStore
from services.common.config import build_config
from services.common.logging import setup_logging
from services.common.server import NodeServer, ServiceBinding, run

log = structlog.get_logger(__name__)


async def serve(config: CacheStoreConfig) -> None:
    servicer = CacheStoreServicer(BlockStore(config.capacity_bytes), chunk_bytes=config.chunk_bytes)
    binding = ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer,
                             cache_store_pb2_grpc.add_CacheStoreServicer_to_server)
    server = NodeServer.from_config(config, [binding], drain=servicer.drain)
    await server.start()
    servicer.address = server.address
    log.info("cache-store ready", address=server.address, capacity_bytes=config.capacity_bytes)
    await server.serve_until_signalled()


def main(argv: Sequence[str] | None = None) -> int:
    config = build_config(CacheStoreConfig, argv, prog="python -m services.cache_store")
    setup_logging(config.log_level, config.log_format)
    run(serve(config))
    return 0

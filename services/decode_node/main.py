"""``python -m services.decode_node``: config → engine → node → servicer → server, until SIGTERM/SIGINT."""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from pdserve.v1 import decode_pb2, decode_pb2_grpc

from services.common.config import build_config
from services.common.logging import setup_logging
from services.common.server import NodeServer, ServiceBinding, run
from services.decode_node.config import DecodeNodeConfig
from services.decode_node.node import DecodeNode
from services.decode_node.servicer import DecodeNodeServicer
from services.engine.engine import LLMEngine
from services.engine.worker import single_threaded_main

log = structlog.get_logger(__name__)


async def serve(config: DecodeNodeConfig) -> None:
    single_threaded_main()
    engine = LLMEngine.from_config(config.engine_config())
    node = DecodeNode(engine, default_lease_s=config.lease_ms / 1000, num_threads=config.threads or None)
    node.start()
    servicer = DecodeNodeServicer(node)
    binding = ServiceBinding(decode_pb2.DESCRIPTOR.services_by_name["DecodeNode"], servicer,
                             decode_pb2_grpc.add_DecodeNodeServicer_to_server)

    async def drain() -> None:
        await node.drain(config.drain_timeout_s)

    server = NodeServer.from_config(config, [binding], drain=drain)
    await server.start()
    servicer.address = config.advertise or server.address
    log.info("decode node ready", address=servicer.address, blocks=engine.kv.num_blocks, dtype=config.dtype)
    try:
        await server.serve_until_signalled()
    finally:
        await node.stop()


def main(argv: Sequence[str] | None = None) -> int:
    config = build_config(DecodeNodeConfig, argv, prog="python -m services.decode_node")
    setup_logging(config.log_level, config.log_format)
    run(serve(config))
    return 0

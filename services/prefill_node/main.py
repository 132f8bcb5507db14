"""``python -m services.prefill_node``: config → engine → node → servicer → server, until SIGTERM/SIGINT."""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from pdserve.v1 import prefill_pb2, prefill_pb2_grpc

from services.common.config import build_config
from services.common.logging import setup_logging
from services.common.server import NodeServer, ServiceBinding, run
from services.engine.engine import LLMEngine
from services.engine.worker import single_threaded_main
from services.prefill_node.config import PrefillNodeConfig
from services.prefill_node.node import PrefillNode
from services.prefill_node.servicer import PrefillNodeServicer

log = structlog.get_logger(__name__)


async def serve(config: PrefillNodeConfig) -> None:
    single_threaded_main()
    engine = LLMEngine.from_config(config.engine_config())
    node = PrefillNode(engine, lease_ms=config.lease_ms, num_threads=config.threads or None)
    node.start()
    servicer = PrefillNodeServicer(node)
    binding = ServiceBinding(prefill_pb2.DESCRIPTOR.services_by_name["PrefillNode"], servicer,
                             prefill_pb2_grpc.add_PrefillNodeServicer_to_server)

    async def drain() -> None:
        await node.drain(config.drain_timeout_s)

    server = NodeServer.from_config(config, [binding], drain=drain)
    await server.start()
    servicer.address = config.advertise or server.address
    log.info("prefill node ready", address=servicer.address, blocks=engine.kv.num_blocks, dtype=config.dtype)
    try:
        await server.serve_until_signalled()
    finally:
        await node.stop()


def main(argv: Sequence[str] | None = None) -> int:
    config = build_config(PrefillNodeConfig, argv, prog="python -m services.prefill_node")
    setup_logging(config.log_level, config.log_format)
    run(serve(config))
    return 0

"""``python -m services.prefill_node``: config → engine → node → servicer → server, until SIGTERM/SIGINT."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.v1 import prefill_pb2, prefill_pb2_grpc

from services.common.config import build_config
from services.common.engine_serve import serve_engine_node
from services.common.logging import setup_logging
from services.common.server import ServiceBinding, run
from services.prefill_node.config import PrefillNodeConfig
from services.prefill_node.node import PrefillNode
from services.prefill_node.prepare import PrepareQueues
from services.prefill_node.servicer import PrefillNodeServicer


async def serve(config: PrefillNodeConfig) -> None:
    def make_binding(node: PrefillNode) -> tuple[ServiceBinding, PrefillNodeServicer]:
        servicer = PrefillNodeServicer(node)
        return ServiceBinding(prefill_pb2.DESCRIPTOR.services_by_name["PrefillNode"], servicer,
                              prefill_pb2_grpc.add_PrefillNodeServicer_to_server), servicer

    await serve_engine_node(
        config, "prefill",
        lambda engine: PrefillNode(engine, lease_ms=config.lease_ms, num_threads=config.threads or None,
                                   prepare=PrepareQueues(config.prepare_settings())),
        make_binding)


def main(argv: Sequence[str] | None = None) -> int:
    config = build_config(PrefillNodeConfig, argv, prog="python -m services.prefill_node")
    setup_logging(config.log_level, config.log_format)
    run(serve(config))
    return 0

"""``python -m services.decode_node``: config → engine → node → servicer → server, until SIGTERM/SIGINT."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.v1 import decode_pb2, decode_pb2_grpc

from services.common.bootstrap import run_service
from services.common.server import ServiceBinding
from services.decode_node.config import DecodeNodeConfig
from services.decode_node.metrics import decode_registry
from services.decode_node.node import DecodeNode
from services.decode_node.servicer import DecodeNodeServicer
from services.engine_node.serve import serve_engine_node


async def serve(config: DecodeNodeConfig) -> None:
    def make_binding(node: DecodeNode) -> tuple[ServiceBinding, DecodeNodeServicer]:
        servicer = DecodeNodeServicer(node)
        return ServiceBinding(decode_pb2.DESCRIPTOR.services_by_name["DecodeNode"], servicer,
                              decode_pb2_grpc.add_DecodeNodeServicer_to_server), servicer

    await serve_engine_node(
        config, "decode",
        lambda engine: DecodeNode(engine, default_lease_s=config.lease_ms / 1000, num_threads=config.threads or None,
                                  handover_after_s=config.handover_after_ms / 1000, kv_ipc=config.kv_ipc == "auto",
                                  max_reservations_per_caller=config.max_reservations_per_caller,
                                  max_reserved_blocks_fraction=config.max_reserved_blocks_per_caller_fraction,
                                  reattach_grace_s=config.reattach_grace_s),
        make_binding, decode_registry, rebalance=lambda node: node.migration.rebalance)


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(DecodeNodeConfig, argv, module="services.decode_node", tracing_name="pdserve-decode",
                       serve=serve, role="decode")

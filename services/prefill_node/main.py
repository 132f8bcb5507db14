"""``python -m services.prefill_node``: config → engine → node → servicer → server, until SIGTERM/SIGINT."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.v1 import prefill_pb2, prefill_pb2_grpc

from services.cache_store.client import AsyncCacheStoreClient
from services.common.bootstrap import run_service
from services.common.server import ServiceBinding
from services.engine.engine import LLMEngine
from services.engine_node.kv_layout import kv_layout
from services.engine_node.serve import serve_engine_node
from services.prefill_node.config import PrefillNodeConfig
from services.prefill_node.metrics import prefill_registry
from services.prefill_node.node import PrefillNode
from services.prefill_node.prefix_store import PrefixStore
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
                                   prepare=PrepareQueues(config.prepare_settings()),
                                   prefix_store=_prefix_store(config, engine), kv_ipc=config.kv_ipc == "auto"),
        make_binding, prefill_registry)


def _prefix_store(config: PrefillNodeConfig, engine: LLMEngine) -> PrefixStore | None:
    """The cache-store's prompt blocks, unless there is none or the model keeps a recurrent state (a hybrid model's
    blocks are no prefix to anyone: its state is not in them)."""
    if not config.cache_store or engine.recurrent_states is not None:
        return None
    return PrefixStore(AsyncCacheStoreClient(config.cache_store, kv_layout(engine.kv_layout_spec()),
                                             timeout_s=config.cache_store_timeout_ms / 1000),
                       write_through=config.cache_store_write_through,
                       writeback_max_bytes=config.cache_store_writeback_mib << 20)


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(PrefillNodeConfig, argv, module="services.prefill_node", tracing_name="pdserve-prefill",
                       serve=serve, role="prefill")

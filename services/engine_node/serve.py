"""The serve loop shared by the nodes that run the model (prefill and decode)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from services.common.bootstrap import serve_bound
from services.common.drain import drain_wait_s
from services.common.malloc import tune_malloc
from services.common.server import NodeServer, ServiceBinding
from services.engine.engine import LLMEngine
from services.engine_node.node_config import EngineNodeConfig
from services.engine_node.remote_store import connect_remote_store
from services.engine_node.worker import single_threaded_main


class EngineNode(Protocol):
    def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def drain(self, timeout_s: float) -> None: ...


async def serve_engine_node(config: EngineNodeConfig, role: str, make_node: Callable[[LLMEngine], EngineNode],
                            make_binding: Callable[[EngineNode], tuple[ServiceBinding, Any]],
                            make_registry: Callable[[Any, asyncio.AbstractEventLoop], CollectorRegistry] | None = None,
                            ) -> None:
    """Load the model, start the node's engine thread, serve until SIGTERM/SIGINT (drain), stop.

    ``make_binding(node)`` returns the service binding and its servicer (whose ``address`` and
    ``metrics_url`` are set once the server is bound); ``make_registry(servicer, loop)`` the metrics
    served at ``config.metrics_listen``."""
    single_threaded_main()
    tune_malloc()  # KV blocks move through this process (prefill → decode, cache-store fetches)
    engine = LLMEngine.from_config(config.engine_config(), remote_store=connect_remote_store)
    node = make_node(engine)
    node.start()
    binding, servicer = make_binding(node)

    async def drain() -> None:
        await node.drain(drain_wait_s(config.drain_timeout_s))

    registry = make_registry(servicer, asyncio.get_running_loop()) if make_registry is not None else None
    server = NodeServer.from_config(config, [binding], drain=drain, registry=registry)
    await serve_bound(server, servicer, config.advertise, f"{role} node ready", stop=node.stop,
                      blocks=engine.num_blocks, dtype=config.dtype)

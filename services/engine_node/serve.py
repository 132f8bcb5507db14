"""The serve loop shared by the nodes that run the model (prefill and decode).

Failing fast: when an exception escapes the engine thread, the node ends its streams (its ``fail_all``) and
tells ``on_engine_failure``; then health turns ``NOT_SERVING`` at once (overall and per service, for good),
and after ``engine_failure_exit_s`` the server stops without the drain hook (no request is left to finish)
and the process exits with :data:`ENGINE_FAILED_EXIT_CODE`, for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry

from services.common.admin import RebalanceHook
from services.common.bootstrap import serve_bound
from services.common.drain import drain_wait_s
from services.common.malloc import tune_malloc
from services.common.server import NodeServer, ServiceBinding
from services.engine.engine import LLMEngine
from services.engine_node.node_config import EngineNodeConfig
from services.engine_node.remote_store import connect_remote_store
from services.engine_node.stats_log import periodic_stats
from services.engine_node.worker import EngineWorker, single_threaded_main

log = structlog.get_logger(__name__)

ENGINE_FAILED_EXIT_CODE = 70
"""The exit code of a node whose engine thread failed (``EX_SOFTWARE``)."""


class EngineNode(Protocol):
    on_engine_failure: Callable[[str], None] | None
    worker: EngineWorker

    def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def drain(self, timeout_s: float) -> None: ...


async def serve_engine_node(config: EngineNodeConfig, role: str, make_node: Callable[[LLMEngine], EngineNode],
                            make_binding: Callable[[EngineNode], tuple[ServiceBinding, Any]],
                            make_registry: Callable[[Any, asyncio.AbstractEventLoop], CollectorRegistry] | None = None,
                            rebalance: Callable[[Any], RebalanceHook] | None = None) -> None:
    """Load the model, start the node's engine thread, serve until SIGTERM/SIGINT (drain), stop; or, once
    the engine thread failed, fail fast (above) and raise ``SystemExit(ENGINE_FAILED_EXIT_CODE)``.

    ``make_binding(node)`` returns the service binding and its servicer (whose ``address`` and
    ``metrics_url`` are set once the server is bound); ``make_registry(servicer, loop)`` the metrics
    served at ``config.metrics_listen``; ``rebalance(node)`` what ``Admin/Rebalance`` runs (decode nodes)."""
    single_threaded_main()
    tune_malloc()  # KV blocks move through this process (prefill → decode, cache-store fetches)
    engine = LLMEngine.from_config(config.engine_config(), remote_store=connect_remote_store)
    node = make_node(engine)
    binding, servicer = make_binding(node)

    async def drain() -> None:
        if not failed.reason:  # after a failure the node ended its requests already
            await node.drain(drain_wait_s(config.drain_timeout_s))

    registry = make_registry(servicer, asyncio.get_running_loop()) if make_registry is not None else None
    server = NodeServer.from_config(config, [binding], drain=drain, registry=registry)
    server.rebalance = rebalance(node) if rebalance is not None else None
    failed = node.on_engine_failure = _FailFast(server, config.engine_failure_exit_s)
    node.start()
    async with periodic_stats(lambda: node.worker.call(LLMEngine.stats), config.stats_log_interval_s):
        await serve_bound(server, servicer, config.advertise, f"{role} node ready", stop=node.stop,
                          blocks=engine.num_blocks, dtype=config.dtype)
    if failed.reason:
        log.error(f"{role} node exits: its engine failed", reason=failed.reason, exit_code=ENGINE_FAILED_EXIT_CODE)
        raise SystemExit(ENGINE_FAILED_EXIT_CODE)


class _FailFast:
    """``node.on_engine_failure``: on the event loop, NOT_SERVING at once, the server stopped
    ``exit_after_s`` later (``serve_engine_node`` then exits)."""

    def __init__(self, server: NodeServer, exit_after_s: float) -> None:
        self.server = server
        self.exit_after_s = exit_after_s
        self.reason = ""
        self._task: asyncio.Task[None] | None = None

    def __call__(self, reason: str) -> None:
        if self._task is None:
            self.reason = reason
            self._task = asyncio.ensure_future(self._fail())

    async def _fail(self) -> None:
        await self.server.set_serving(False)
        await self.server.health.enter_graceful_shutdown()  # for good: a late set_serving(True) is ignored
        log.error("engine failed: NOT_SERVING, exiting", reason=self.reason, exit_in_s=self.exit_after_s)
        await asyncio.sleep(self.exit_after_s)
        self.server.request_stop()

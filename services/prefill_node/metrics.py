"""The prefill node's ``/metrics``: its engine (blocks, queues, prefix cache), its use of the cache-store,
and the KV it sent to decode nodes. Read at scrape time on the node's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

from pdserve.v1 import gateway_pb2
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from services.common.kv_transfer_stats import KVTransferStats
from services.common.metrics import LoopCollector, counter, new_registry
from services.engine_node.metrics import engine_node_families, kv_transfer_families
from services.prefill_node.servicer import PrefillNodeServicer

Snapshot = tuple[gateway_pb2.NodeStatus, KVTransferStats]


def prefill_registry(servicer: PrefillNodeServicer, loop: asyncio.AbstractEventLoop) -> CollectorRegistry:
    registry = new_registry("prefill")

    async def read() -> Snapshot:
        return await servicer.status(), dataclasses.replace(servicer.node.kv_sent)

    registry.register(LoopCollector(loop, read, render))
    return registry


def render(snapshot: Snapshot) -> Iterator[Metric]:
    status, sent = snapshot
    yield from engine_node_families(status)
    yield counter("pdserve_store_hit_tokens_total", "Prompt tokens fetched from the cache-store instead of computed",
                  status.store_hit_tokens_total)
    yield from kv_transfer_families(sent, "sent")

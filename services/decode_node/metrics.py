"""The decode node's ``/metrics``: its engine (blocks, queues, prefix cache, preemption and offload), the
KV it received from prefill nodes, and handovers. Read at scrape time on the node's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

from pdserve.v1 import gateway_pb2
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric

from services.common.kv_transfer_stats import KVTransferStats
from services.common.metrics import LoopCollector, labelled, new_registry
from services.decode_node.servicer import DecodeNodeServicer
from services.engine_node.metrics import engine_node_families, kv_transfer_families

Snapshot = tuple[gateway_pb2.NodeStatus, KVTransferStats]


def decode_registry(servicer: DecodeNodeServicer, loop: asyncio.AbstractEventLoop) -> CollectorRegistry:
    registry = new_registry("decode")

    async def read() -> Snapshot:
        return await servicer.status(), dataclasses.replace(servicer.node.kv_received)

    registry.register(LoopCollector(loop, read, render))
    return registry


def render(snapshot: Snapshot) -> Iterator[Metric]:
    status, received = snapshot
    yield from engine_node_families(status)
    yield from kv_transfer_families(received, "received")
    yield labelled(CounterMetricFamily("pdserve_handovers", "Preempted requests handed to (out) or adopted from (in) "
                                       "another decode node", labels=["direction"]),
                   "direction", [("out", status.handovers_out_total), ("in", status.handovers_in_total)])

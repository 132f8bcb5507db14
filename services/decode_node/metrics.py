"""The decode node's ``/metrics``: its engine (blocks, queues, prefix cache, preemption and offload), the
KV it received from prefill nodes, handovers, and a drain's migrations. Read at scrape time on the node's
event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

from pdserve.v1 import gateway_pb2
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily

from services.common.kv_transfer_stats import KVTransferStats
from services.common.metrics import LoopCollector, counter, labelled, new_registry
from services.decode_node.migration import MigrationStats
from services.decode_node.servicer import DecodeNodeServicer
from services.engine_node.metrics import engine_node_families, kv_transfer_families

Snapshot = tuple[gateway_pb2.NodeStatus, KVTransferStats, MigrationStats]


def decode_registry(servicer: DecodeNodeServicer, loop: asyncio.AbstractEventLoop) -> CollectorRegistry:
    registry = new_registry("decode")

    async def read() -> Snapshot:
        node = servicer.node
        return await servicer.status(), dataclasses.replace(node.kv_received), dataclasses.replace(node.migration.stats)

    registry.register(LoopCollector(loop, read, render))
    return registry


def render(snapshot: Snapshot) -> Iterator[Metric]:
    status, received, migrations = snapshot
    yield from engine_node_families(status)
    yield from kv_transfer_families(received, "received")
    yield labelled(CounterMetricFamily("pdserve_handovers", "Preempted requests handed to (out) or adopted from (in) "
                                       "another decode node", labels=["direction"]),
                   "direction", [("out", status.handovers_out_total), ("in", status.handovers_in_total)])
    yield from migration_families(migrations)


def migration_families(stats: MigrationStats) -> Iterator[Metric]:
    """A drain's or a rebalance's live migrations (``migration.py``)."""
    yield labelled(CounterMetricFamily("pdserve_migrations", "Running requests a draining or rebalancing node "
                                       "handed to a peer with their KV (moved) or as tokens to recompute "
                                       "(recomputed), or kept (no peer took them)", labels=["outcome"]),
                   "outcome", stats.outcomes())
    yield counter("pdserve_migrated_bytes_total", "KV bytes of the requests a draining node handed to peers",
                  stats.moved_bytes_total)
    seconds = SummaryMetricFamily("pdserve_migration_seconds", "From a moved request's mark for migration to its "
                                  "peer's grant (KV copied to the cache-store, offered, read there)")
    seconds.add_metric([], count_value=stats.moved_total, sum_value=stats.seconds_total)
    yield seconds

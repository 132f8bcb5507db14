"""The cache-store's ``/metrics``: bytes, blocks and capacity per tier, hits per tier, misses, evictions
per tier, calls in flight. Read at scrape time on the store's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from pdserve.v1 import gateway_pb2
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.cache_store.servicer import CacheStoreServicer
from services.common.metrics import LoopCollector, counter, gauge, labelled, new_registry


def cache_store_registry(servicer: CacheStoreServicer, loop: asyncio.AbstractEventLoop) -> CollectorRegistry:
    registry = new_registry("cache_store")

    async def read() -> gateway_pb2.NodeStatus:
        return servicer.status()

    registry.register(LoopCollector(loop, read, render))
    return registry


def render(s: gateway_pb2.NodeStatus) -> Iterator[Metric]:
    """Tiers: memory and disk (a block may be in both; without a disk tier its series stay 0)."""
    def per_tier(family: GaugeMetricFamily | CounterMetricFamily, memory: float, disk: float) -> Metric:
        return labelled(family, "tier", [("memory", memory), ("disk", disk)])

    yield per_tier(GaugeMetricFamily("pdserve_cache_store_bytes", "Block bytes held, by tier", labels=["tier"]),
                   s.bytes_used, s.disk_bytes_used)
    yield per_tier(GaugeMetricFamily("pdserve_cache_store_capacity_bytes", "Budget for block bytes, by tier "
                                     "(disk 0: no disk tier)", labels=["tier"]),
                   s.bytes_total, s.disk_bytes_total)
    yield per_tier(GaugeMetricFamily("pdserve_cache_store_blocks", "Blocks held, by tier", labels=["tier"]),
                   s.memory_blocks, s.disk_blocks)
    yield gauge("pdserve_cache_store_stored_blocks", "Distinct blocks stored (either tier)", s.blocks_total)
    yield per_tier(CounterMetricFamily("pdserve_cache_store_hits", "Prefix blocks served by Get, by the tier "
                                       "read", labels=["tier"]),
                   s.hits_total - s.disk_hits_total, s.disk_hits_total)
    yield counter("pdserve_cache_store_misses_total", "Prefix keys a Get or Lookup asked for that were not "
                  "stored", s.misses_total)
    yield counter("pdserve_cache_store_restored_blocks_total", "Blocks a decode node read back for a request "
                  "of its own (a preempted copy, a handed-over request); not prefix hits",
                  s.restored_blocks_total)
    yield per_tier(CounterMetricFamily("pdserve_cache_store_evictions", "Blocks dropped from a tier "
                                       "(from memory: written to disk first when there is one)", labels=["tier"]),
                   s.memory_evictions_total, s.disk_evictions_total)
    yield counter("pdserve_cache_store_disk_write_failures_total", "Blocks evicted from memory that could not be "
                  "written to disk, dropped instead (a full or failing disk)", s.disk_write_failures_total)
    yield gauge("pdserve_cache_store_calls_in_flight", "Put and Get calls running now", s.requests_running)

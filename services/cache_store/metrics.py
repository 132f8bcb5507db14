"""The cache-store's ``/metrics``: bytes, blocks and capacity per tier, hits per tier, misses, evictions
per tier, calls in flight, and the integrity counters (corrupt blocks dropped per tier, re-puts of other
bytes kept out, Deletes refused for another writer's blocks). Read at scrape time on the store's event
loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

from pdserve.v1 import gateway_pb2
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.cache_store.servicer import CacheStoreServicer
from services.cache_store.store import StoreStats
from services.common.metrics import LoopCollector, counter, gauge, labelled, new_registry


def cache_store_registry(servicer: CacheStoreServicer, loop: asyncio.AbstractEventLoop) -> CollectorRegistry:
    registry = new_registry("cache_store")

    async def read() -> Reading:
        return Reading(servicer.status(), servicer.store.stats())

    registry.register(LoopCollector(loop, read, render_reading))
    return registry


@dataclass(frozen=True)
class Reading:
    status: gateway_pb2.NodeStatus
    stats: StoreStats


def render_reading(reading: Reading) -> Iterator[Metric]:
    yield from render(reading.status)
    yield from render_integrity(reading.stats)


def render_integrity(s: StoreStats) -> Iterator[Metric]:
    """First writer wins, writer-bound deletes, digests checked on read (store.py)."""
    yield labelled(CounterMetricFamily("pdserve_cache_store_corrupt_blocks", "Blocks dropped because their "
                                       "bytes no longer matched the digest taken at Put (or their disk file was "
                                       "unreadable), by tier", labels=["tier"]),
                   "tier", [("memory", s.memory_corrupt_total), ("disk", s.disk_corrupt_total)])
    yield counter("pdserve_cache_store_kept_existing_total", "Blocks put again with other bytes than stored: the "
                  "stored block was kept (first writer wins)", s.kept_existing_total)
    yield counter("pdserve_cache_store_foreign_deletes_total", "Deletes refused because a key was put by another "
                  "caller", s.foreign_deletes_total)


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

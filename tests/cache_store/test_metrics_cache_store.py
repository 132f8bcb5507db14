"""The cache-store process's /metrics (its URL from NodeStatus): tier bytes, blocks, hits, misses and
evictions move as blocks are put, pushed to disk and read back."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, node_pb2

from services.common.launch import ServiceProcess, launch
from services.common.server import grpc_options
from services.common.tls.channels import open_sync_channel
from tests.cache_store.helpers import FP, key, put_stream
from tests.common.test_metrics_endpoint import scrape, value

BLOCK = 1000


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[ServiceProcess]:
    disk = tmp_path_factory.mktemp("store-disk")
    with launch("services.cache_store", "--capacity-bytes", str(3 * BLOCK), "--disk-dir", str(disk),
                "--disk-capacity-bytes", str(100 * BLOCK), "--log-level", "warning") as process:
        yield process


def test_tier_series_move_with_puts_disk_spills_hits_and_misses(node):
    with open_sync_channel(node.address, "cache-store", grpc_options()) as channel:
        stub = cache_store_pb2_grpc.CacheStoreStub(channel)
        url = stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=5).metrics_url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        before = scrape(url)
        assert value(before, "pdserve_build_info", role="cache_store", version=_version()) == 1
        assert value(before, "pdserve_status_up") == 1
        assert value(before, "pdserve_cache_store_capacity_bytes", tier="memory") == 3 * BLOCK
        assert value(before, "pdserve_cache_store_capacity_bytes", tier="disk") == 100 * BLOCK
        assert value(before, "pdserve_cache_store_blocks", tier="memory") == 0

        blocks = [(key(f"b{i}"), os.urandom(BLOCK)) for i in range(4)]  # one more than memory holds
        for pair in blocks:  # a put is all or none, and at most the memory tier's size
            stub.Put(put_stream([pair]), timeout=10)
        received = [chunk for k, _ in blocks  # one key a Get: a caller's Gets may lease half the memory tier
                    for chunk in stub.Get(cache_store_pb2.GetRequest(keys=[k], model_fingerprint=FP), timeout=10)]
        assert len([c for c in received if c.key]) == 4
        assert stub.Lookup(cache_store_pb2.LookupRequest(keys=[key("nope")]), timeout=5).num_prefix_hits == 0

        after = scrape(url)
    assert value(after, "pdserve_cache_store_blocks", tier="memory") <= 3
    assert value(after, "pdserve_cache_store_bytes", tier="memory") <= 3 * BLOCK
    assert value(after, "pdserve_cache_store_blocks", tier="disk") >= 1
    assert value(after, "pdserve_cache_store_bytes", tier="disk") >= BLOCK
    assert value(after, "pdserve_cache_store_evictions_total", tier="memory") >= 1
    hits = value(after, "pdserve_cache_store_hits_total", tier="memory") + value(
        after, "pdserve_cache_store_hits_total", tier="disk")
    assert hits == 4 and value(after, "pdserve_cache_store_hits_total", tier="disk") >= 1
    assert value(after, "pdserve_cache_store_misses_total") == value(before, "pdserve_cache_store_misses_total") + 1
    assert value(after, "pdserve_cache_store_calls_in_flight") == 0


def _version() -> str:
    from importlib import metadata

    return metadata.version("pdserve")

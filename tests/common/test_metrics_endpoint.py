"""The shared metrics plumbing: the /metrics endpoint, scrape-time reads on the event loop, NodeServer's
wiring of both, and the families of an engine node's status."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request

import pytest
from pdserve.v1 import gateway_pb2
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from services.common.kv_transfer_stats import KVTransferStats
from services.common.metrics import LoopCollector, MetricsEndpoint, advertised_host, gauge, new_registry
from services.common.server import NodeServer
from services.common.server_config import ServerConfig
from services.engine_node.metrics import engine_node_families, kv_transfer_families
from tests.common.test_node_server import Store, binding


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of one GET of ``url``."""
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_the_endpoint_serves_its_registry_on_an_ephemeral_port_until_stopped():
    registry = new_registry("tester")
    hits = Counter("pdserve_test_hits", "hits", registry=registry)
    hits.inc(3)
    endpoint = MetricsEndpoint(registry, "127.0.0.1:0")
    port = endpoint.start()
    try:
        assert port > 0 and endpoint.url() == f"http://127.0.0.1:{port}/metrics"
        samples = scrape(endpoint.url())
        assert value(samples, "pdserve_test_hits_total") == 3
        assert value(samples, "pdserve_build_info", role="tester", version=_version()) == 1
        assert value(samples, "process_resident_memory_bytes") > 0
    finally:
        endpoint.stop()
    endpoint.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        scrape(f"http://127.0.0.1:{port}/metrics")


def _version() -> str:
    from importlib import metadata

    return metadata.version("pdserve")


def test_a_wildcard_bind_host_is_advertised_as_the_node_s_grpc_host():
    assert advertised_host("127.0.0.1", "10.0.0.7:50051") == "127.0.0.1"
    assert advertised_host("0.0.0.0", "10.0.0.7:50051") == "10.0.0.7"
    assert advertised_host("::", "[fd00::7]:50051") == "fd00::7"
    assert advertised_host("0.0.0.0", "0.0.0.0:50051") not in ("", "0.0.0.0")  # this machine's address
    endpoint = MetricsEndpoint(CollectorRegistry(), "0.0.0.0:0")
    endpoint.port = 9090  # as if started
    assert endpoint.url("10.0.0.7:50051") == "http://10.0.0.7:9090/metrics"


async def test_a_loop_collector_reads_on_the_event_loop_at_scrape_time():
    loop = asyncio.get_running_loop()
    reads: list[threading.Thread] = []
    state = {"queued": 4}

    async def read() -> int:
        reads.append(threading.current_thread())
        return state["queued"]

    registry = CollectorRegistry()
    registry.register(LoopCollector(loop, read, lambda n: [gauge("pdserve_test_queued", "queued", n)]))
    assert reads == []  # registering reads nothing
    endpoint = MetricsEndpoint(registry, "127.0.0.1:0")
    endpoint.start()
    try:
        samples = await asyncio.to_thread(scrape, endpoint.url())
        assert value(samples, "pdserve_test_queued") == 4 and value(samples, "pdserve_status_up") == 1
        state["queued"] = 7
        samples = await asyncio.to_thread(scrape, endpoint.url())
        assert value(samples, "pdserve_test_queued") == 7
        assert reads == [threading.current_thread()] * 2  # the loop's thread, not the scraper's
    finally:
        await asyncio.to_thread(endpoint.stop)


async def test_a_failed_or_stuck_read_is_status_up_0_and_the_scrape_still_answers():
    loop = asyncio.get_running_loop()

    async def broken() -> int:
        raise RuntimeError("engine worker is stopped")

    async def stuck() -> int:
        await asyncio.Event().wait()
        return 0

    for read in (broken, stuck):
        registry = CollectorRegistry()
        registry.register(LoopCollector(loop, read, lambda n: [gauge("pdserve_test_queued", "queued", n)],
                                        timeout_s=0.2))
        samples = await asyncio.to_thread(_collect, registry)
        assert samples == {("pdserve_status_up", ()): 0}


async def test_collecting_on_the_loop_thread_is_refused_not_a_deadlock():
    async def read() -> int:
        return 1

    collector = LoopCollector(asyncio.get_running_loop(), read, lambda n: [])
    with pytest.raises(AssertionError, match="deadlock"):
        list(collector.collect())


def _collect(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in registry.collect() for s in f.samples}


async def test_node_server_serves_metrics_from_start_to_shutdown_and_reports_the_url():
    registry = new_registry("tester")
    config = ServerConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", grace_s=0)
    server = NodeServer.from_config(config, [binding(Store())], registry=registry)
    assert server.metrics_url() == ""  # not started
    await server.start()
    url = server.metrics_url()
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        assert value(await asyncio.to_thread(scrape, url), "pdserve_build_info", role="tester",
                     version=_version()) == 1
    finally:
        await server.shutdown()
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(scrape, url)

    quiet = NodeServer.from_config(ServerConfig(listen="127.0.0.1:0", metrics_listen="", grace_s=0),
                                   [binding(Store())], registry=new_registry("tester"))
    await quiet.start()
    try:
        assert quiet.metrics is None and quiet.metrics_url() == ""
    finally:
        await quiet.shutdown()


async def test_a_taken_metrics_port_fails_the_start():
    first = MetricsEndpoint(CollectorRegistry(), "127.0.0.1:0")
    port = first.start()
    try:
        config = ServerConfig(listen="127.0.0.1:0", metrics_listen=f"127.0.0.1:{port}", grace_s=0)
        server = NodeServer.from_config(config, [binding(Store())], registry=CollectorRegistry())
        with pytest.raises(OSError, match="metrics endpoint"):
            await server.start()
    finally:
        first.stop()


def test_engine_node_blocks_by_state_sum_to_the_capacity():
    status = gateway_pb2.NodeStatus(
        role="decode", blocks_total=100, blocks_free=50, blocks_cached=20, blocks_reserved=10, block_size=16,
        bytes_total=1 << 20, requests_running=3, requests_waiting=2, prompt_tokens_total=640,
        prefix_hit_tokens_total=320, requests_total=5, prefix_hit_requests_total=2, preemptions_total=4,
        offloads_total=3, offloaded_bytes_total=3000, offloaded_remote_bytes_total=1000, resumes_total=2,
        recomputes_total=1, evictions_total=6)
    samples = _samples(engine_node_families(status))
    states = {labels[0][1]: v for (name, labels), v in samples.items() if name == "pdserve_kv_blocks"}
    assert states == {"free": 50, "cached": 20, "reserved": 10, "held": 20}
    assert sum(states.values()) == value(samples, "pdserve_kv_capacity_blocks") == 100
    assert value(samples, "pdserve_prefix_hit_tokens_total") == 320
    assert value(samples, "pdserve_prompt_tokens_total") == 640
    assert value(samples, "pdserve_requests_running") == 3 and value(samples, "pdserve_requests_waiting") == 2
    assert value(samples, "pdserve_offloaded_bytes_total", tier="host") == 2000
    assert value(samples, "pdserve_offloaded_bytes_total", tier="cache_store") == 1000
    assert (value(samples, "pdserve_preemptions_total"), value(samples, "pdserve_resumes_total"),
            value(samples, "pdserve_recomputes_total")) == (4, 2, 1)
    assert all(name.startswith("pdserve_") for name, _ in samples)


def test_kv_transfer_counters_carry_their_direction():
    stats = KVTransferStats()
    stats.add(4096, 2, 0.5)
    stats.add(2048, 1, 0.25)
    samples = _samples(kv_transfer_families(stats, "sent"))
    assert value(samples, "pdserve_kv_transfer_bytes_total", direction="sent") == 6144
    assert value(samples, "pdserve_kv_transfer_blocks_total", direction="sent") == 3
    assert value(samples, "pdserve_kv_transfer_seconds_total", direction="sent") == 0.75


def _samples(families) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}

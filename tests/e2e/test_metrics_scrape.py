"""/metrics of every process of a live cluster (gateway, two prefill nodes, a decode node, the cache-store),
found through ClusterStatus, scraped before and after three requests that share a long prefix: the first
is computed cold, the second runs on the other prefill node and fetches the prefix from the cache-store,
the third hits the first node's prefix cache. Every service's series move by what those requests did."""

from __future__ import annotations

import time

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from tests.common.test_metrics_endpoint import scrape, value
from tests.e2e.conftest import greedy, wait_idle
from tests.engine.prompts import long_text

pytestmark = pytest.mark.slow
NEW_TOKENS = 8
BLOCK = 16


@pytest.fixture(scope="module")
def cluster(prefill_pair):
    # load routing: equally loaded prefill nodes rotate, so the second request is a cache-store hit elsewhere
    return prefill_pair


@pytest.fixture(scope="module")
def stub(cluster):
    with grpc.insecure_channel(cluster.address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


def status(stub) -> gateway_pb2.ClusterStatusResponse:
    return stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10)


def run(stub, token_ids: list[int]) -> list[gateway_pb2.GenerateResponse]:
    request = gateway_pb2.GenerateRequest(token_ids=token_ids, sampling=greedy(NEW_TOKENS))
    return list(stub.Generate(request, timeout=120))


def grew(before: dict, after: dict, name: str, **labels: str) -> float:
    """How much a series grew (one that did not exist before counts from 0)."""
    key = (name, tuple(sorted(labels.items())))
    return value(after, name, **labels) - before.get(key, 0.0)


def store_blocks(stub) -> int:
    return next(n for n in status(stub).nodes if n.role == "cache_store").memory_blocks


def wait_for_store_blocks(stub, at_least: int, timeout_s: float = 20.0) -> None:
    """The prefill node's write-back to the cache-store runs after the request: wait for it to land."""
    deadline = time.monotonic() + timeout_s
    while (held := store_blocks(stub)) < at_least:
        assert time.monotonic() < deadline, f"write-back never reached the store: {held} of {at_least} blocks"
        time.sleep(0.1)


def test_every_service_s_metrics_move_as_requests_run(cluster, stub, bundled_tokenizer):
    cluster_status = status(stub)
    nodes = {n.address: n for n in cluster_status.nodes}
    urls = {"gateway": cluster_status.gateway_metrics_url, **{a: n.metrics_url for a, n in nodes.items()}}
    assert sorted(n.role for n in nodes.values()) == ["cache_store", "decode", "prefill", "prefill"]
    assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in urls.values()), urls
    assert len(set(urls.values())) == 5
    before = {who: scrape(url) for who, url in urls.items()}
    stored_before = store_blocks(stub)  # the cluster is shared (conftest.PREFILL_PAIR): its store may hold blocks
    for address, node in nodes.items():
        assert value(before[address], "pdserve_build_info", role=node.role, version="0.1.0") == 1
        assert value(before[address], "pdserve_status_up") == 1
    for who in urls:  # every process watches its event loop
        assert value(before[who], "pdserve_event_loop_stalls_total") >= 0, who
    assert value(before["gateway"], "pdserve_gateway_nodes", role="prefill", state="healthy") == 2

    prefix = bundled_tokenizer.encode("Metrics. " + long_text(4))  # an opening no other module's prompt has
    assert len(prefix) > 16 * BLOCK
    shared = (len(prefix) // BLOCK - 1) * BLOCK  # tokens of the prefix's blocks every later request can reuse
    responses = []
    for i in range(3):
        responses.append(run(stub, prefix + bundled_tokenizer.encode(f" Question {i}: who kept the clocks?")))
        wait_idle(stub)
        if i == 0:
            wait_for_store_blocks(stub, at_least=stored_before + shared // BLOCK)
    first_p, second_p, third_p = (r[0].prefill_node for r in responses)
    assert second_p != first_p and third_p == first_p, "the gateway no longer rotates equally loaded prefill nodes"
    decode = next(a for a, n in nodes.items() if n.role == "decode")
    store = next(a for a, n in nodes.items() if n.role == "cache_store")
    idle = {n.address: n for n in status(stub).nodes}
    after = {who: scrape(url) for who, url in urls.items()}

    # Gateway: every request timed once, its tokens counted.
    g0, g1 = before["gateway"], after["gateway"]
    for histogram in ("ttft", "tpot", "e2e"):
        assert grew(g0, g1, f"pdserve_request_{histogram}_seconds_count") == 3, histogram
    assert value(g1, "pdserve_request_ttft_seconds_sum") > 0
    assert grew(g0, g1, "pdserve_requests_total", outcome="length") == 3
    assert grew(g0, g1, "pdserve_request_generation_tokens_total") == 3 * NEW_TOKENS
    assert grew(g0, g1, "pdserve_request_cached_tokens_total") == sum(r[-1].usage.cached_tokens for r in responses)
    assert value(g1, "pdserve_requests_in_flight") == 0

    # Prefill nodes: the third request hit the first node's prefix cache, the second fetched from the store.
    assert grew(before[first_p], after[first_p], "pdserve_prefix_hit_tokens_total") >= shared
    assert grew(before[second_p], after[second_p], "pdserve_store_hit_tokens_total") >= shared
    prompt_tokens = sum(grew(before[p], after[p], "pdserve_prompt_tokens_total") for p in (first_p, second_p))
    assert prompt_tokens == sum(r[-1].usage.prompt_tokens for r in responses)

    # KV transfer: what the prefill nodes sent is what the decode node received.
    for unit in ("bytes", "blocks"):
        sent = sum(grew(before[p], after[p], f"pdserve_kv_transfer_{unit}_total", direction="sent")
                   for p in (first_p, second_p))
        received = grew(before[decode], after[decode], f"pdserve_kv_transfer_{unit}_total", direction="received")
        assert sent == received > 0, unit
    assert value(after[first_p], "pdserve_kv_transfer_seconds_total", direction="sent") > 0
    assert value(after[decode], "pdserve_kv_transfer_seconds_total", direction="received") > 0

    # The decode node already held the prefix's blocks for the second and third requests.
    assert grew(before[decode], after[decode], "pdserve_prefix_hit_tokens_total") >= 2 * shared

    # Blocks, idle: nothing reserved or held; cached as ClusterStatus says; the states sum to the capacity.
    for address in (first_p, second_p, decode):
        samples, node = after[address], idle[address]
        states = {s: value(samples, "pdserve_kv_blocks", state=s) for s in ("free", "cached", "reserved", "held")}
        assert states["reserved"] == states["held"] == 0, (address, states)
        assert (states["free"], states["cached"]) == (node.blocks_free, node.blocks_cached), address
        assert sum(states.values()) == value(samples, "pdserve_kv_capacity_blocks") == node.blocks_total
        assert states["cached"] > value(before[address], "pdserve_kv_blocks", state="cached"), address
        assert value(samples, "pdserve_requests_running") == value(samples, "pdserve_requests_waiting") == 0

    # Cache-store: the first request's blocks written back, the second's fetch served from memory.
    s0, s1 = before[store], after[store]
    assert grew(s0, s1, "pdserve_cache_store_blocks", tier="memory") >= shared // BLOCK
    assert grew(s0, s1, "pdserve_cache_store_bytes", tier="memory") > 0
    assert grew(s0, s1, "pdserve_cache_store_hits_total", tier="memory") >= shared // BLOCK
    assert value(s1, "pdserve_cache_store_capacity_bytes", tier="memory") == idle[store].bytes_total

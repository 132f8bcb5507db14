"""2 prefill × 2 decode nodes: every request completes, both decode nodes are used, and a decode node with
no room refuses at once, so requests it cannot take go to the other without waiting."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc, prefill_pb2, prefill_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.common.tls.channels import open_sync_channel
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy, model_nodes, wait_idle
from tests.engine.prompts import long_text

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster2x2():
    spec = ClusterSpec(num_prefill=2, num_decode=2, cache_store=False, engine_args=ENGINE_ARGS,
                       decode_args=("--num-kv-blocks", "256"), gateway_args=GATEWAY_ARGS)
    with start_cluster(spec, stderr=subprocess.DEVNULL) as running, \
            grpc.insecure_channel(running.address) as channel:
        yield running, gateway_pb2_grpc.GatewayStub(channel)


def test_all_requests_complete_and_both_decode_nodes_are_used(cluster2x2):
    cluster, stub = cluster2x2
    prompts = [f"Question {i}: name a colour that starts with the letter {chr(65 + i)}." for i in range(12)]

    def run(prompt):
        first = None
        tokens = []
        for response in stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, sampling=greedy(24)), timeout=120):
            first = first or response
            tokens += response.token_ids
            last = response
        return first.prefill_node, first.decode_node, len(tokens), last.finish_reason

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(run, prompts))
    assert all(n == 24 and reason == "length" for _, _, n, reason in results), results
    assert {d for _, d, _, _ in results} == {d.address for d in cluster.decode}
    assert {p for p, _, _, _ in results} == {p.address for p in cluster.prefill}
    wait_idle(stub)


def test_a_full_decode_node_refuses_at_once_and_the_next_candidate_takes_the_request(cluster2x2,
                                                                                    bundled_tokenizer):
    """One decode node's pool is spoken for by a long-running request (its prompt plus the headroom of its
    expected output); a prefill listing it first gets a refusal and goes straight to the other node, and
    requests through the gateway keep completing."""
    cluster, stub = cluster2x2
    hog = stub.Generate(gateway_pb2.GenerateRequest(prompt=long_text(14), sampling=greedy(3000)), timeout=300)
    full = next(hog).decode_node
    other = ({d.address for d in cluster.decode} - {full}).pop()
    # the first token comes from the prefill node, maybe before the hog's KV is committed on the decode node;
    # until then its blocks are a live reservation of its prefill node, and a second request from that node
    # would be refused by the per-caller bound (max_reserved_blocks_per_caller), not for want of room
    deadline = time.monotonic() + 60
    while not any(n.address == full and n.requests_running >= 1 for n in model_nodes(stub)):
        assert time.monotonic() < deadline, "the hog never started decoding"
        time.sleep(0.05)
    # ~1200 tokens sharing no prefix with the hog's: more blocks than the full node can spare
    prompt_ids = bundled_tokenizer.encode(" ".join(f"item{i}" for i in range(350)))
    assert 1100 < len(prompt_ids) < 1400, len(prompt_ids)
    request = prefill_pb2.PrefillRequest(request_id="routed", prompt_token_ids=prompt_ids,
                                         sampling=gateway_pb2.SamplingParams(max_tokens=8, temperature=0, seed=3),
                                         decode_candidates=[full, other])
    with open_sync_channel(cluster.prefill[0].address, "prefill") as channel:
        events = list(prefill_pb2_grpc.PrefillNodeStub(channel).Prefill(request, timeout=120))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["refused", "reserved", "first_token", "done"], kinds
    assert events[0].refused.decode_address == full and "no room" in events[0].refused.reason
    assert events[1].reserved.decode_address == other

    def run(i):
        _, _, last = generate(stub, timeout=120, prompt=long_text(3) + f" Part {i}.", sampling=greedy(8))
        return last.finish_reason

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(run, range(4))) == ["length"] * 4
    hog.cancel()
    wait_idle(stub)

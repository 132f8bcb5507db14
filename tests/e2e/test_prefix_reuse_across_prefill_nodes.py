"""Two prefill nodes sharing a cache-store: an 800+-token prefix computed by one is fetched, not
recomputed, by the other; outputs equal the mixed engine's cold run; the store's counters move."""

from __future__ import annotations

import time

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.e2e.conftest import greedy, wait_idle
from tests.engine.prompts import long_text

pytestmark = pytest.mark.slow
NEW_TOKENS = 8
BLOCK = 16


@pytest.fixture(scope="module")
def cluster(prefill_pair):
    # load routing: equally loaded prefill nodes rotate (cache-aware routing would keep the prefix on one node)
    return prefill_pair


@pytest.fixture(scope="module")
def stub(cluster):
    with grpc.insecure_channel(cluster.address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


@pytest.fixture(scope="module")
def prompts(bundled_tokenizer):
    prefix = bundled_tokenizer.encode("Prefix reuse. " + long_text(13))  # an opening no other module's prompt has
    assert len(prefix) > 800
    shared = [prefix + bundled_tokenizer.encode(f" Question {i}: who kept the clocks?") for i in range(2)]
    return [*shared, bundled_tokenizer.encode("Another story. " + long_text(3))]


@pytest.fixture(scope="module")
def expected(fp32_model, bundled_tokenizer, prompts):
    results = make_engine(fp32_model, bundled_tokenizer).generate(
        prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    return [r.token_ids for r in results]


def _run(stub, token_ids: list[int]) -> list[gateway_pb2.GenerateResponse]:
    request = gateway_pb2.GenerateRequest(token_ids=token_ids, sampling=greedy(NEW_TOKENS))
    return list(stub.Generate(request, timeout=120))


def _tokens(responses: list[gateway_pb2.GenerateResponse]) -> list[int]:
    return [t for r in responses for t in r.token_ids]


def _status(stub) -> dict[str, gateway_pb2.NodeStatus]:
    return {n.address: n for n in stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10).nodes}


def wait_written_back(stub, node: str, blocks: int, timeout_s: float = 20.0) -> None:
    """Until ``node``'s count of prompt blocks written to the cache-store reaches ``blocks``: it writes them
    in the background, after the request has finished (a request that comes sooner rightly misses the store)."""
    deadline = time.monotonic() + timeout_s
    while (written := _status(stub)[node].store_written_blocks_total) < blocks:
        assert time.monotonic() < deadline, f"{node} wrote {written} of {blocks} blocks back in {timeout_s} s"
        time.sleep(0.1)


def test_a_prefix_computed_on_one_prefill_node_is_a_hit_on_the_other(cluster, stub, prompts, expected):
    shared_blocks = (len(prompts[0]) - 1) // BLOCK  # at most this many leading blocks can be served by a cache
    before = _status(stub)  # the cluster is shared (conftest.PREFILL_PAIR): its counters count from here
    responses = _run(stub, prompts[0])
    first_node = responses[0].prefill_node
    assert _tokens(responses) == expected[0]
    assert responses[-1].usage.cached_tokens == 0
    wait_idle(stub)
    written_before = before[first_node].store_written_blocks_total
    wait_written_back(stub, first_node, written_before + shared_blocks)

    # The router rotates equally loaded prefill nodes: the next request lands on the other one.
    responses = _run(stub, prompts[1])
    second_node = responses[0].prefill_node
    assert second_node != first_node, "the gateway routed both requests to the same prefill node"
    assert _tokens(responses) == expected[1], "output with the prefix fetched from the cache-store differs"
    assert responses[-1].usage.cached_tokens >= 800
    wait_idle(stub)

    status = _status(stub)
    second, second_before = status[second_node], before[second_node]
    assert second.store_hit_tokens_total - second_before.store_hit_tokens_total >= 800, second
    assert second.store_fetched_bytes_total > second_before.store_fetched_bytes_total
    # the first node wrote its blocks back
    assert status[first_node].store_written_blocks_total - written_before >= shared_blocks
    store = next(n for n in status.values() if n.role == "cache_store")
    assert store.hits_total - before[store.address].hits_total >= 800 // BLOCK


def test_a_request_asking_for_prompt_logprobs_computes_its_prompt_and_fetches_nothing(cluster, stub, prompts,
                                                                                     expected):
    """Its prefix is in the store and on a node (the test above): it is computed whole all the same, and the
    prefill node asks the store for nothing (the blocks would only be held beside its own)."""
    before = _status(stub)
    request = gateway_pb2.GenerateRequest(token_ids=prompts[1], sampling=greedy(NEW_TOKENS, prompt_logprobs=0))
    responses = list(stub.Generate(request, timeout=120))
    assert _tokens(responses) == expected[1]
    assert [lp.token_id for lp in responses[0].prompt_logprobs] == prompts[1][1:]
    assert responses[-1].usage.cached_tokens == 0
    wait_idle(stub)
    node = responses[0].prefill_node
    after = _status(stub)[node]
    assert after.store_hit_tokens_total == before[node].store_hit_tokens_total
    assert after.store_fetched_bytes_total == before[node].store_fetched_bytes_total


def test_a_dead_cache_store_costs_only_the_computation(cluster, stub, prompts, expected):
    """kill -9 of the store: prefill nodes fall back to computing (and writing back nothing), outputs stay
    right, nothing leaks. Runs last in this module: the store stays dead (a module that asks for the shared
    PREFILL_PAIR after this gets a fresh cluster, ``conftest.SharedCluster``)."""
    cluster.cache_store.process.kill()
    cluster.cache_store.process.wait()
    nodes = set()
    for _ in range(2):  # a prompt neither node holds: each asks the dead store, then computes
        responses = _run(stub, prompts[2])
        assert _tokens(responses) == expected[2]
        nodes.add(responses[0].prefill_node)
    assert len(nodes) == 2
    wait_idle(stub)

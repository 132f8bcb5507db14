"""The gateway leaves out model nodes that serve another model than its own (its tokenizer would not fit
theirs): unhealthy, saying both models, never routed to; a node that reports no model matches any."""

from __future__ import annotations

import structlog
from pdserve.v1 import gateway_pb2

from services.gateway.model_check import MISMATCH, ModelIdentity, with_model_check
from services.gateway.nodes import CACHE_STORE, DECODE, PREFILL, NodeInfo
from tests.gateway.conftest import start_cluster, stop_cluster

OURS = ModelIdentity("SmolLM2-135M-Instruct", "a1" * 16)
THEIRS = ModelIdentity("Qwen3-0.6B", "b2" * 16)


def node(address: str, role: str, model: ModelIdentity | None, healthy: bool = True) -> NodeInfo:
    return NodeInfo(address, role, healthy=healthy, model_name=model.name if model else "",
                    weights_digest=model.weights_digest if model else "", blocks_total=100, blocks_free=100)


def test_a_node_serving_another_model_is_unhealthy_naming_both_models():
    nodes = [node("p1", PREFILL, OURS), node("p2", PREFILL, THEIRS), node("d1", DECODE, THEIRS),
             node("d2", DECODE, OURS), node("s", CACHE_STORE, None)]
    marked = {n.address: n for n in with_model_check(nodes, OURS)}
    assert [a for a, n in marked.items() if n.healthy] == ["p1", "d2", "s"]
    assert marked["p2"].error == (
        f"{MISMATCH}: Qwen3-0.6B (weights {'b2' * 6}), the gateway tokenizes for SmolLM2-135M-Instruct "
        f"(weights {'a1' * 6}); start both with the same --model")
    assert marked["d1"].error == marked["p2"].error


def test_same_digest_no_digest_or_no_check_leave_nodes_alone():
    renamed = ModelIdentity("another name, same bytes", OURS.weights_digest)
    nodes = [node("p1", PREFILL, renamed), node("p2", PREFILL, None), node("d1", DECODE, THEIRS)]
    assert [n.healthy for n in with_model_check(nodes, OURS)] == [True, True, False]
    assert all(n.healthy for n in with_model_check(nodes, None))
    assert all(n.healthy for n in with_model_check(nodes, ModelIdentity("unknown", "")))
    down = node("d2", DECODE, THEIRS, healthy=False)
    assert with_model_check([down], OURS)[0].error == ""  # down already: that is its reason


async def test_requests_are_never_routed_to_a_node_serving_another_model(tokenizer, model_config):
    cluster = await start_cluster(tokenizer, model_config, num_prefill=2, num_decode=2, model=OURS)
    try:
        good_p, bad_p = cluster.prefill
        good_d, bad_d = cluster.decode
        with structlog.testing.capture_logs() as logs:  # the background polls' lines too
            for fake, model in ((good_p, OURS), (good_d, OURS), (bad_p, THEIRS), (bad_d, THEIRS)):
                fake.status.model_name, fake.status.weights_digest = model.name, model.weights_digest
            await cluster.gateway.directory.refresh()
        status = await cluster.stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
        nodes = {n.address: n for n in status.nodes}
        assert (status.model_name, status.weights_digest) == (OURS.name, OURS.weights_digest)
        assert status.served_model_name == "SmolLM2-135M-Instruct"
        for bad in (bad_p, bad_d):
            assert not nodes[bad.address].healthy
            assert nodes[bad.address].error.startswith(f"{MISMATCH}: Qwen3-0.6B")
            assert nodes[bad.address].weights_digest == THEIRS.weights_digest
        assert nodes[good_p.address].healthy and nodes[good_d.address].healthy
        left_out = [e for e in logs if e["event"] == "node left out: it serves another model than the gateway's"]
        assert sorted(e["address"] for e in left_out) == sorted([bad_p.address, bad_d.address])
        assert left_out[0]["log_level"] == "warning" and left_out[0]["error"].startswith(MISMATCH)
        for _ in range(8):  # the idle bad nodes look as free as the good ones
            message = gateway_pb2.GenerateRequest(token_ids=[1, 2, 3], sampling=gateway_pb2.SamplingParams(
                max_tokens=1))
            responses = [r async for r in cluster.stub.Generate(message, timeout=5)]
            assert (responses[0].prefill_node, responses[0].decode_node) == (good_p.address, good_d.address)
            assert set(good_p.requests[-1].decode_candidates) == {good_d.address}
        assert bad_p.requests == [] and bad_d.attaches == []

        with structlog.testing.capture_logs() as logs:
            bad_p.status.weights_digest = OURS.weights_digest  # restarted with the gateway's model: back in
            await cluster.gateway.directory.refresh()
        assert all(n.healthy for n in cluster.gateway.directory.nodes(PREFILL))
        assert [e["address"] for e in logs if e["event"].startswith("node back in rotation")] == [bad_p.address]
    finally:
        await stop_cluster(cluster)

"""Router: least-loaded prefill node, decode candidates by available blocks then load, unhealthy skipped."""

from __future__ import annotations

import dataclasses

import pytest

from services.gateway.nodes import DECODE, PREFILL, NodeInfo
from services.gateway.router import NoHealthyNodeError, Router


def prefill(address: str, running: int = 0, waiting: int = 0, healthy: bool = True, inflight: int = 0) -> NodeInfo:
    return NodeInfo(address, PREFILL, healthy=healthy, requests_running=running, requests_waiting=waiting,
                    inflight=inflight)


def decode(address: str, free: int = 100, cached: int = 0, running: int = 0, healthy: bool = True) -> NodeInfo:
    return NodeInfo(address, DECODE, healthy=healthy, blocks_total=200, blocks_free=free, blocks_cached=cached,
                    requests_running=running)


def test_prefill_is_the_least_loaded_counting_running_and_waiting():
    nodes = [prefill("p1", running=2, waiting=1), prefill("p2", running=1, waiting=1), prefill("p3", running=4)]
    assert Router().pick_prefill(nodes) == "p2"


def test_prefill_load_counts_what_this_gateway_sent_since_the_last_poll():
    nodes = [prefill("p1", running=1), prefill("p2", running=0, inflight=3)]
    assert Router().pick_prefill(nodes) == "p1"


def test_prefill_ties_rotate_round_robin():
    router = Router()
    nodes = [prefill("p1"), prefill("p2"), prefill("p3", running=1)]
    picks = [router.route(nodes, [decode("d1")]).prefill for _ in range(4)]
    assert picks == ["p1", "p2", "p1", "p2"]


def test_decode_candidates_by_available_blocks_then_load():
    nodes = [decode("d1", free=10), decode("d2", free=50, running=3), decode("d3", free=50, running=1),
             decode("d4", free=5, cached=60)]
    assert Router().order_decode(nodes) == ("d4", "d3", "d2", "d1")


def test_decode_ties_rotate_so_a_burst_spreads():
    router = Router()
    nodes = [decode("d1"), decode("d2")]
    firsts = [router.route([prefill("p")], nodes).decode_candidates for _ in range(4)]
    assert firsts == [("d1", "d2"), ("d2", "d1"), ("d1", "d2"), ("d2", "d1")]


def test_unhealthy_nodes_are_skipped():
    route = Router().route([prefill("p1", healthy=False), prefill("p2", running=9)],
                           [decode("d1", free=200, healthy=False), decode("d2", free=1)])
    assert route.prefill == "p2"
    assert route.decode_candidates == ("d2",)


def test_nodes_of_another_role_are_ignored():
    with pytest.raises(NoHealthyNodeError):
        Router().pick_prefill([decode("d1")])


@pytest.mark.parametrize("role", [PREFILL, DECODE])
def test_no_healthy_node_of_a_role_is_unavailable(role):
    prefills = [prefill("p1", healthy=role != PREFILL)]
    decodes = [decode("d1", healthy=role != DECODE), decode("d2", healthy=role != DECODE)]
    with pytest.raises(NoHealthyNodeError, match=f"no healthy {role} node") as error:
        Router().route(prefills, decodes)
    assert error.value.code.name == "UNAVAILABLE"
    known = 1 if role == PREFILL else 2
    assert str(error.value) == f"no healthy {role} node ({known} known; the gateway's log and ClusterStatus say why)"
    assert len(error.value.reasons) == known


def test_why_nodes_are_left_out_stays_out_of_the_clients_message():
    """Another model's name and weights digest, a KV layout's fingerprint, a node's address: the reasons
    are kept for the gateway, the message (what a client reads) names none of them."""
    left_out = [dataclasses.replace(prefill("p1", healthy=False),
                                    error="it serves another model: Secret-70B (weights 0123456789ab)"),
                dataclasses.replace(prefill("p2", healthy=False),
                                    error="its KV layout kvlayout-fp-1 matches no healthy decode node (kvlayout-fp-2)")]
    with pytest.raises(NoHealthyNodeError) as error:
        Router().route(left_out, [decode("d1")])
    for secret in ("Secret-70B", "0123456789ab", "kvlayout-fp", "p1", "p2"):
        assert secret not in str(error.value)
    assert error.value.reasons == [f"p1: {left_out[0].error}", f"p2: {left_out[1].error}"]

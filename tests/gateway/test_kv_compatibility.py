"""Pairing prefill and decode nodes by KV layout: a node whose layout no healthy peer has is unhealthy,
saying why; a request's decode candidates match its prefill node; an empty id matches any."""

from __future__ import annotations

import pytest

from services.gateway.kv_compatibility import with_kv_compatibility
from services.gateway.nodes import CACHE_STORE, DECODE, PREFILL, NodeInfo
from services.gateway.router import NoHealthyNodeError, Router


def node(address: str, role: str, layout: str, healthy: bool = True) -> NodeInfo:
    return NodeInfo(address, role, healthy=healthy, kv_layout_id=layout, blocks_total=100, blocks_free=100)


def test_a_node_whose_layout_no_healthy_peer_has_is_unhealthy_saying_why():
    nodes = [node("p1", PREFILL, "f32"), node("p2", PREFILL, "bf16"), node("d1", DECODE, "f32"),
             node("s", CACHE_STORE, "")]
    marked = {n.address: n for n in with_kv_compatibility(nodes)}
    assert marked["p1"].healthy and marked["d1"].healthy and marked["s"].healthy
    assert not marked["p2"].healthy
    assert marked["p2"].error == ("its KV layout bf16 matches no healthy decode node's (f32): another model, "
                                  "dtype or block size")


def test_when_no_pair_matches_both_sides_say_so():
    marked = with_kv_compatibility([node("p", PREFILL, "bf16"), node("d", DECODE, "f32")])
    assert [n.healthy for n in marked] == [False, False]
    assert "matches no healthy decode node's (f32)" in marked[0].error
    assert "matches no healthy prefill node's (bf16)" in marked[1].error


def test_unknown_layouts_and_missing_peers_leave_nodes_alone():
    assert all(n.healthy for n in with_kv_compatibility([node("p", PREFILL, ""), node("d", DECODE, "f32")]))
    assert all(n.healthy for n in with_kv_compatibility([node("p", PREFILL, "f32"), node("d", DECODE, "")]))
    lone = with_kv_compatibility([node("p", PREFILL, "f32"), node("d", DECODE, "bf16", healthy=False)])
    assert lone[0].healthy  # no healthy decode node: that, not the layout, is what the router reports


def test_the_decode_candidates_match_the_prefill_node_chosen():
    router = Router()
    prefill = [node("p1", PREFILL, "f32"), node("p2", PREFILL, "bf16")]
    decode = [node("d1", DECODE, "f32"), node("d2", DECODE, "bf16"), node("d3", DECODE, "")]
    routes = {router.route(prefill, decode) for _ in range(4)}
    assert {(r.prefill, frozenset(r.decode_candidates)) for r in routes} == {
        ("p1", frozenset({"d1", "d3"})), ("p2", frozenset({"d2", "d3"}))}


def test_with_no_healthy_match_the_error_names_every_decode_node():
    prefill = [node("p1", PREFILL, "f32")]
    decode = [node("d1", DECODE, "", healthy=False), node("d2", DECODE, "bf16", healthy=False)]
    with pytest.raises(NoHealthyNodeError, match=r"\(2 known"):
        Router().route(prefill, decode)

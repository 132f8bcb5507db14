"""Cache-aware routing (``--routing cache_aware``, the default): a prompt goes to the prefill node that holds
its longest prefix by the gateway's index of what it routed, within a load margin of the least loaded; decode
candidates by held prefix, then free blocks; ``load`` routing ignores prefixes. Pure logic, milliseconds."""

from __future__ import annotations

import pytest

from services.gateway.prefix_affinity import PrefixAffinity, block_hashes
from services.gateway.router import Router
from tests.gateway.test_router import decode, prefill

SYSTEM_A = list(range(1000, 1064))  # 4 blocks of 16
SYSTEM_B = list(range(2000, 2064))


def ask(system: list[int], question: int) -> list[int]:
    return system + [question] * 10


def test_block_hashes_chain_full_blocks_only():
    a, b = block_hashes(ask(SYSTEM_A, 1)), block_hashes(ask(SYSTEM_A, 2))
    assert len(a) == 4 and a == b  # the questions are in the partial last block
    assert block_hashes(SYSTEM_B)[1:] != block_hashes(SYSTEM_A)[1:]
    changed = [*SYSTEM_A[:20], 7, *SYSTEM_A[21:]]
    assert block_hashes(changed)[0] == a[0] and block_hashes(changed)[1:] != a[1:]  # chained: later blocks differ


def test_affinity_matches_leading_blocks_and_forgets_the_oldest_past_capacity():
    index = PrefixAffinity()
    a, b = block_hashes(SYSTEM_A), block_hashes(SYSTEM_B)
    index.record("n", a, capacity_blocks=6)
    assert index.matched_blocks("n", a) == 4 and index.matched_blocks("n", b) == 0
    index.record("n", b, capacity_blocks=6)  # 8 blocks into 6: A's first two are the oldest
    assert index.size("n") == 6 and index.matched_blocks("n", a) == 0 and index.matched_blocks("n", b) == 4


def test_each_system_prompt_sticks_to_the_prefill_node_that_computed_it():
    router, nodes, decodes = Router(), [prefill("p1"), prefill("p2")], [decode("d1"), decode("d2")]
    first_a = router.route(nodes, decodes, ask(SYSTEM_A, 1)).prefill
    first_b = router.route(nodes, decodes, ask(SYSTEM_B, 1)).prefill
    assert first_a != first_b  # neither held anything: least loaded, ties rotate
    for question in range(2, 8):  # A twice, then B: round robin alone would alternate
        assert router.route(nodes, decodes, ask(SYSTEM_A, question)).prefill == first_a
        assert router.route(nodes, decodes, ask(SYSTEM_A, -question)).prefill == first_a
        assert router.route(nodes, decodes, ask(SYSTEM_B, question)).prefill == first_b


def test_a_node_past_the_load_margin_loses_its_prefix_to_the_least_loaded():
    router = Router(load_margin=2)
    router.route([prefill("p1"), prefill("p2", running=9)], [decode("d1")], ask(SYSTEM_A, 1))  # to p1
    near = [prefill("p1", running=2), prefill("p2")]
    assert router.route(near, [decode("d1")], ask(SYSTEM_A, 2)).prefill == "p1"  # within the margin
    far = [prefill("p1", running=3), prefill("p2")]
    assert router.route(far, [decode("d1")], ask(SYSTEM_A, 3)).prefill == "p2"


def test_decode_candidates_lead_with_the_node_holding_the_prefix():
    router = Router()
    router.route([prefill("p")], [decode("d1", free=10), decode("d2", free=90)], ask(SYSTEM_A, 1))  # d2: more room
    route = router.route([prefill("p")], [decode("d1", free=90), decode("d2", free=10)], ask(SYSTEM_A, 2))
    assert route.decode_candidates == ("d2", "d1")  # d2 holds the prefix, though d1 has more room now
    other = router.route([prefill("p")], [decode("d1", free=90), decode("d2", free=10)], ask(SYSTEM_B, 1))
    assert other.decode_candidates == ("d1", "d2")  # no prefix held: most available blocks


def test_load_routing_ignores_prefixes():
    router = Router("load")
    nodes = [prefill("p1"), prefill("p2")]
    picks = {router.route(nodes, [decode("d1")], ask(SYSTEM_A, q)).prefill for q in range(4)}
    assert picks == {"p1", "p2"} and router.affinity.size("p1") == 0


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="routing must be one of cache_aware, load"):
        Router("random")


def test_prefill_only_requests_rotate_and_stick_to_their_prefix_as_routed_ones_do():
    router, nodes = Router(), [prefill("p1"), prefill("p2")]
    first, second = list(range(100, 164)), list(range(500, 564))  # 4 blocks each
    assert [router.route_prefill_only(nodes, first), router.route_prefill_only(nodes, second)] == ["p1", "p2"]
    assert [router.route_prefill_only(nodes, p) for p in (second, first, second)] == ["p2", "p1", "p2"]
    assert router.route(nodes, [decode("d1")], first).prefill == "p1", "an embedding's blocks count for a Generate"

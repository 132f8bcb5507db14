"""A draining decode node's live migration, in-process with the real model, real gRPC and a real
cache-store; the peer is scripted (grants or refuses). Node A keeps preempted KV in host memory first
(the default ``offload_remote``): migration sends it to the cache-store all the same.

- peers grant: ``drain`` moves both running requests at once (no ``handover_after`` wait), each stream
  ends with ``moved_to`` after the tokens made here, the offers carry the KV keys, the metrics count them;
- peers refuse: both finish here with the output of an undisturbed run, counted as kept;
- no offload cache-store: nothing is offered, both finish here (today's drain).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.decode_node.handover import Route
from services.decode_node.metrics import migration_families
from services.decode_node.node import DecodeNode, TokenStream
from services.decode_node.servicer import DecodeNodeServicer
from services.engine.admission import AdmissionConfig
from services.engine_node.remote_store import connect_remote_store
from tests.conftest import make_engine
from tests.decode_node.test_handover_node import (
    GREEDY,
    FakePeer,
    _assert_whole,
    _events,
    _serve,
    expected,
    prompts,
    store,
)

pytestmark = pytest.mark.slow
__all__ = ["expected", "prompts", "store"]  # the fixtures, shared with the handover tests


@contextlib.asynccontextmanager
async def _node_a(model, tokenizer, store_address: str | None, prompts, peer: FakePeer):
    offload = {"offload_cache_store": store_address, "remote_store": connect_remote_store} if store_address else {}
    engine = make_engine(model, tokenizer, num_kv_blocks=64, admission=AdmissionConfig(policy="none"), **offload)
    node = DecodeNode(engine, num_threads=2)  # no handover_after: only the drain moves anything
    peer_server, a_server = await _serve(peer), None
    try:
        servicer = DecodeNodeServicer(node)
        a_server = await _serve(servicer)
        node.address = servicer.address = a_server.address
        node.start()
        for i, ids in enumerate(prompts):  # as if committed after a prefill: a stream and a route each
            rid = f"r{i}"
            node.streams[rid] = TokenStream()
            node._set_route(rid, Route([a_server.address, peer_server.address]))
            await node.worker.call(lambda e, rid=rid, ids=ids: e.add_request(sampling=GREEDY, token_ids=ids,
                                                                             request_id=rid))
        yield node, peer_server.address
    finally:
        await node.stop()
        for server in (a_server, peer_server):
            if server is not None:
                await server.shutdown()


def _samples(node: DecodeNode) -> dict:
    return {(s.name, tuple(s.labels.items())): s.value for f in migration_families(node.migration.stats)
            for s in f.samples}


async def test_a_drain_hands_every_running_request_to_a_peer_that_grants(fp32_model, bundled_tokenizer, store,
                                                                        prompts):
    peer = FakePeer(grant=True)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer) as (node, peer_address):
        streams = [asyncio.ensure_future(_events(node, f"r{i}")) for i in range(2)]
        await asyncio.sleep(0.3)  # a few tokens each
        await node.drain(30.0)
        results = await asyncio.gather(*streams)
        assert sorted(a.request_id for a in peer.adopts) == ["r0", "r1"]
        for (tokens, finish, moved_to), i in zip(results, range(2), strict=True):
            offer = next(a for a in peer.adopts if a.request_id == f"r{i}")
            assert moved_to == peer_address and finish == ""
            assert tokens == list(offer.output_token_ids) and len(tokens) >= 1
            assert offer.cache_store == store and len(offer.kv_keys) == -(-offer.num_computed_tokens // 16)
        stats = node.migration.stats
        assert (stats.moved_total, stats.kept_total) == (2, 0) and stats.seconds_total > 0
        size = node.engine.kv_layout_spec().bytes_per_block * sum(len(a.kv_keys) for a in peer.adopts)
        samples = _samples(node)
        assert samples[("pdserve_migrations_total", (("outcome", "moved"),))] == 2
        assert samples[("pdserve_migrated_bytes_total", ())] == size
        assert samples[("pdserve_migration_seconds_count", ())] == 2
        assert node.engine.scheduler.stats.preemptions_total == 0
        await _assert_whole(node)


@pytest.mark.parametrize("offload", [True, False], ids=["peers-refuse", "no-cache-store"])
async def test_requests_no_peer_takes_finish_here_with_an_undisturbed_output(fp32_model, bundled_tokenizer, store,
                                                                            prompts, expected, offload):
    peer = FakePeer(grant=False)
    async with _node_a(fp32_model, bundled_tokenizer, store if offload else None, prompts, peer) as (node, _):
        streams = [asyncio.ensure_future(_events(node, f"r{i}")) for i in range(2)]
        await asyncio.sleep(0.3)
        await node.drain(60.0)
        results = await asyncio.gather(*streams)
        assert [tokens for tokens, _, _ in results] == expected
        assert all(finish == "length" and not moved for _, finish, moved in results)
        assert len(peer.adopts) == (2 if offload else 0)
        assert (node.migration.stats.moved_total, node.migration.stats.kept_total) == (0, 2 if offload else 0)
        assert node.engine.scheduler.stats.recomputes_total == 0
        await _assert_whole(node)

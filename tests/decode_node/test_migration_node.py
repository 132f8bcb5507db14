"""A draining decode node's live migration, in-process with the real model, real gRPC and a real
cache-store; the peer is scripted (grants or refuses). Node A keeps preempted KV in host memory first
(the default ``offload_remote``): migration sends it to the cache-store all the same.

- peers grant: ``drain`` moves both running requests at once (no ``handover_after`` wait), each stream
  ends with ``moved_to`` after the tokens made here, the offers carry the KV keys, the metrics count them;
- peers refuse: both are offered again while the drain lasts, and finish here with the output of an
  undisturbed run, counted as kept;
- no offload cache-store: each is handed over as tokens only, to be recomputed by the peer (or here when
  refused);
- a peer that refuses the first offer takes the second; the peer is one only a gateway's status poll named
  (``NodeStatusRequest.decode_nodes``), not the request's own route;
- ``Rebalance`` (the node serving on) moves the newest decoding request, the other finishes here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from pdserve.v1 import decode_pb2_grpc, node_pb2

from services.common.tls.channels import open_channel
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
from tests.tls_identities import identity_of

pytestmark = pytest.mark.slow
__all__ = ["expected", "prompts", "store"]  # the fixtures, shared with the handover tests


class GrantsSecond(FakePeer):
    """Refuses the first offer of each request, grants the next."""

    async def Adopt(self, request, context):
        self.grant = any(a.request_id == request.request_id for a in self.adopts)
        return await super().Adopt(request, context)


@contextlib.asynccontextmanager
async def _node_a(model, tokenizer, store_address: str | None, prompts, peer: FakePeer, route_to_peer: bool = True):
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
            node._set_route(rid, Route([a_server.address, *([peer_server.address] if route_to_peer else [])]))
            await node.worker.call(lambda e, rid=rid, ids=ids: e.add_request(sampling=GREEDY, token_ids=ids,
                                                                             request_id=rid))
        yield node, peer_server.address
    finally:
        await node.stop()
        for server in (a_server, peer_server):
            if server is not None:
                await server.shutdown()


async def _decoding(node: DecodeNode, tokens: int = 2, timeout_s: float = 60.0) -> None:
    """Until every request the node runs has made ``tokens`` tokens (a fixed sleep was too short on a loaded
    machine: a request still prefilling is neither moved nor kept)."""
    deadline = time.monotonic() + timeout_s
    while await node.worker.call(lambda e: bool(e.scheduler.waiting) or any(
            r.num_output_tokens < tokens for r in e.scheduler.running)):
        assert time.monotonic() < deadline, "the requests never started decoding"
        await asyncio.sleep(0.05)


def _samples(node: DecodeNode) -> dict:
    return {(s.name, tuple(s.labels.items())): s.value for f in migration_families(node.migration.stats)
            for s in f.samples}


async def test_a_drain_hands_every_running_request_to_a_peer_that_grants(fp32_model, bundled_tokenizer, store,
                                                                        prompts):
    peer = FakePeer(grant=True)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer) as (node, peer_address):
        streams = [asyncio.ensure_future(_events(node, f"r{i}")) for i in range(2)]
        await _decoding(node)  # a few tokens each
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
        await _decoding(node)
        await node.drain(60.0)
        results = await asyncio.gather(*streams)
        assert [tokens for tokens, _, _ in results] == expected
        assert all(finish == "length" and not moved for _, finish, moved in results)
        assert len(peer.adopts) >= 2, "each offered at least once (again while the drain lasts)"
        assert all(bool(a.kv_keys) == offload for a in peer.adopts), "no cache-store: offered as tokens only"
        stats = node.migration.stats
        assert (stats.moved_total, stats.recomputed_total, stats.kept_total) == (0, 0, 2)
        recomputes = node.engine.scheduler.stats.recomputes_total
        assert recomputes == 0 if offload else recomputes >= 2, "refused without a copy: recomputed here"
        await _assert_whole(node)


async def test_a_node_without_a_cache_store_hands_its_requests_over_to_be_recomputed(fp32_model, bundled_tokenizer,
                                                                                   prompts):
    peer = FakePeer(grant=True)
    async with _node_a(fp32_model, bundled_tokenizer, None, prompts, peer) as (node, peer_address):
        streams = [asyncio.ensure_future(_events(node, f"r{i}")) for i in range(2)]
        await _decoding(node)
        await node.drain(30.0)
        results = await asyncio.gather(*streams)
        assert all(moved == peer_address for _, _, moved in results)
        for offer in peer.adopts:
            assert offer.num_computed_tokens == 0 and not offer.kv_keys and not offer.cache_store
        stats = node.migration.stats
        assert (stats.moved_total, stats.recomputed_total, stats.moved_bytes_total) == (0, 2, 0)
        assert _samples(node)[("pdserve_migrations_total", (("outcome", "recomputed"),))] == 2
        await _assert_whole(node)


async def test_a_refused_request_is_offered_again_to_a_peer_only_a_gateway_named(fp32_model, bundled_tokenizer,
                                                                                store, prompts, expected):
    peer = GrantsSecond(grant=False)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer, route_to_peer=False) as (node, address):
        node.migration.retry_first_s = 0.05
        streams = [asyncio.ensure_future(_events(node, f"r{i}")) for i in range(2)]
        async with open_channel(node.address, "decode") as channel:  # as the tests' identity (every role)
            stub = decode_pb2_grpc.DecodeNodeStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.NodeStatus(node_pb2.NodeStatusRequest(decode_nodes=["no port"]), timeout=10)
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "decode_nodes" in bad.value.details()
            async with open_channel(node.address, "decode", identity=identity_of("prefill")) as prefill_channel:
                await decode_pb2_grpc.DecodeNodeStub(prefill_channel).NodeStatus(
                    node_pb2.NodeStatusRequest(decode_nodes=[address]), timeout=10)
            assert node.migration.peers_of("r0").peers == [], "only a gateway's poll names migration targets"
            await stub.NodeStatus(node_pb2.NodeStatusRequest(decode_nodes=[address, node.address]), timeout=10)
        assert node.migration.peers_of("r0").peers == [address], "the gateway's node, this one left out"
        await node.drain(30.0)
        results = await asyncio.gather(*streams)
        assert all(moved == address for _, _, moved in results)
        assert sorted(a.request_id for a in peer.adopts) == ["r0", "r0", "r1", "r1"], "refused once, then taken"
        for (tokens, _, _), want in zip(results, expected, strict=True):
            assert tokens == want[:len(tokens)], "what was made here, then resumed from the copy, is undisturbed"
        assert (node.migration.stats.moved_total, node.migration.stats.kept_total) == (2, 0)
        await _assert_whole(node)


async def test_rebalance_moves_the_newest_decoding_request_and_the_node_serves_on(fp32_model, bundled_tokenizer,
                                                                                  store, prompts, expected):
    peer = FakePeer(grant=True)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer) as (node, peer_address):
        streams = [asyncio.ensure_future(_events(node, f"r{i}")) for i in range(2)]
        await _decoding(node)
        moved, kept = await node.migration.rebalance(1, 10.0, "test")
        assert (moved, kept) == (["r1"], []), "the most recently admitted one"
        (kept_tokens, finish, not_moved), (_, _, moved_to) = await asyncio.gather(*streams)
        assert moved_to == peer_address and not not_moved and finish == "length"
        assert kept_tokens == expected[0], "the one left decodes on here, undisturbed"
        assert not node.draining and node.migration.stats.moved_total == 1
        await _assert_whole(node)

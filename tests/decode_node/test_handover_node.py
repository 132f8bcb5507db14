"""The decode node's side of a handover, in-process with the real model and real gRPC:

- sending (node A): a preempted request whose KV is in the cache-store is offered to its peers (a fake
  peer here, scripted to refuse, grant or stall); a refusal leaves it on A, a grant ends A's stream with
  ``moved_to``, and an abort while the offer is in flight reaches the peer that granted;
- receiving (node B): an adoption whose KV fetch fails or is cancelled leaves B's pool whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

import grpc
import grpc.aio
import pytest
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common.errors import UnavailableError
from services.common.launch import launch
from services.common.server import NodeServer, ServiceBinding
from services.decode_node.handover import Route
from services.decode_node.node import DecodeNode, TokenStream
from services.decode_node.servicer import DecodeNodeServicer
from services.engine.admission import AdmissionConfig
from services.engine.handover import HandedRequest
from services.engine.sampling_params import SamplingParams
from services.engine_node.remote_store import connect_remote_store
from tests.conftest import make_engine
from tests.engine.prompts import STORY

pytestmark = pytest.mark.slow
NEW_TOKENS = 40
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


class FakePeer(decode_pb2_grpc.DecodeNodeServicer):
    """A decode peer whose ``Adopt`` answers ``grant`` (after ``release`` is set, when given)."""

    def __init__(self, grant: bool, release: asyncio.Event | None = None):
        self.grant = grant
        self.release = release
        self.adopts: list[decode_pb2.AdoptRequest] = []
        self.aborts: list[str] = []

    async def Adopt(self, request, context):
        self.adopts.append(request)
        if self.release is not None:
            await self.release.wait()
        return decode_pb2.AdoptResponse(granted=self.grant, reason="" if self.grant else "no room: test")

    async def Abort(self, request, context):
        self.aborts.append(request.request_id)
        return node_pb2.AbortResponse(found=True)


async def _serve(servicer) -> NodeServer:
    binding = ServiceBinding(decode_pb2.DESCRIPTOR.services_by_name["DecodeNode"], servicer,
                             decode_pb2_grpc.add_DecodeNodeServicer_to_server)
    server = NodeServer([binding], listen="127.0.0.1:0", grace_s=0)
    await server.start()
    return server


@pytest.fixture(scope="module")
def store():
    with launch("services.cache_store", stderr=subprocess.DEVNULL) as process:
        yield process.address


@pytest.fixture(scope="module")
def prompts(bundled_tokenizer):
    words = STORY.split()
    return [bundled_tokenizer.encode(f"Request {i}: " + " ".join(words[i * 7:i * 7 + 16])) for i in range(2)]


@pytest.fixture(scope="module")
def expected(fp32_model, bundled_tokenizer, prompts):
    return [r.token_ids for r in make_engine(fp32_model, bundled_tokenizer).generate(prompts, GREEDY)]


@contextlib.asynccontextmanager
async def _node_a(model, tokenizer, store, prompts, peer: FakePeer):
    """Node A (6 blocks, admission none, KV always to the cache-store) running both prompts, with the
    fake peer as their only decode peer; yields (node, peer address)."""
    engine = make_engine(model, tokenizer, num_kv_blocks=6, admission=AdmissionConfig(policy="none"),
                         offload_cache_store=store, offload_remote="always", remote_store=connect_remote_store)
    node = DecodeNode(engine, num_threads=2, handover_after_s=0.05)
    peer_server, a_server = await _serve(peer), None
    try:
        servicer = DecodeNodeServicer(node)
        a_server = await _serve(servicer)
        servicer.address = a_server.address
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


async def _events(node: DecodeNode, rid: str) -> tuple[list[int], str, str]:
    """The stream's tokens, finish reason and moved_to."""
    tokens, finish, moved = [], "", ""
    async for event in node.attach(rid):
        tokens += event.token_ids
        finish, moved = event.finish_reason or "", event.moved_to
    return tokens, finish, moved


async def _eventually(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not reached in {timeout_s}s"
        await asyncio.sleep(0.02)


async def _assert_whole(node: DecodeNode) -> None:
    def check(engine):
        engine.check_integrity()
        return (engine.kv.num_free_blocks, engine.kv.num_blocks, dict(engine.reservations.reservations),
                dict(engine.handovers.lent), dict(engine.offload._copies), engine.has_unfinished())

    free, total, reserved, lent, copies, busy = await node.worker.call(check)
    assert (free, reserved, lent, copies, busy) == (total, {}, {}, {}, False)


async def test_a_refused_offer_leaves_the_request_on_its_node(fp32_model, bundled_tokenizer, store, prompts,
                                                              expected):
    peer = FakePeer(grant=False)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer) as (node, _):
        outputs = await asyncio.gather(*(_events(node, f"r{i}") for i in range(2)))
        assert [tokens for tokens, _, _ in outputs] == expected
        assert all(finish == "length" and not moved for _, finish, moved in outputs)
        assert peer.adopts, "a preempted request was offered"
        offer = peer.adopts[0]
        assert offer.cache_store == store and offer.from_node == node.address
        assert list(offer.decode_peers) == [node.address]  # where it may go next: back here
        assert offer.num_computed_tokens == len(offer.prompt_token_ids) + len(offer.output_token_ids) - 1
        assert len(offer.kv_keys) == -(-offer.num_computed_tokens // 16)
        stats = node.engine.scheduler.stats
        assert stats.recomputes_total == 0 and stats.resumes_total >= 1
        assert node.engine.handovers.stats.handovers_out_total == 0
        await _assert_whole(node)


async def test_a_granted_offer_ends_the_stream_with_moved_to_and_abort_follows_it(fp32_model, bundled_tokenizer,
                                                                                 store, prompts):
    peer = FakePeer(grant=True)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer) as (node, peer_address):
        await _eventually(lambda: node.moved, what="a handover")
        moved = next(iter(node.moved))
        assert node.moved[moved] == peer_address
        assert peer.aborts == []
        # the gateway has not attached yet and gives up: the abort reaches the node that runs it now
        assert await node.abort(moved)
        await _eventually(lambda: peer.aborts == [moved], what="Abort forwarded to the adopter")
        other = next(f"r{i}" for i in range(2) if f"r{i}" != moved)
        assert (await _events(node, other))[1] == "length"
        assert node.engine.handovers.stats.handovers_out_total == 1
        await _assert_whole(node)


async def test_the_moved_to_event_is_the_last_of_the_stream(fp32_model, bundled_tokenizer, store, prompts):
    peer = FakePeer(grant=True)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer) as (node, peer_address):
        results = await asyncio.gather(*(_events(node, f"r{i}") for i in range(2)))
        moved = [(tokens, finish, moved_to) for tokens, finish, moved_to in results if moved_to]
        assert len(moved) == 1 and len(peer.adopts) == 1
        tokens, finish, moved_to = moved[0]
        assert moved_to == peer_address and finish == ""
        assert tokens == list(peer.adopts[0].output_token_ids), "the tokens up to the handover, then moved_to"
        assert not node.moved and not node.streams
        await _assert_whole(node)


async def test_an_abort_while_the_offer_is_in_flight_reaches_the_peer_that_granted(fp32_model, bundled_tokenizer,
                                                                                  store, prompts):
    release = asyncio.Event()
    peer = FakePeer(grant=True, release=release)
    async with _node_a(fp32_model, bundled_tokenizer, store, prompts, peer) as (node, _):
        await _eventually(lambda: peer.adopts, what="an offer")
        rid = peer.adopts[0].request_id
        assert await node.abort(rid)
        release.set()
        await _eventually(lambda: peer.aborts == [rid], what="Abort to the peer that granted")
        assert rid not in node.moved and node.engine.handovers.stats.handovers_out_total == 0
        other = next(f"r{i}" for i in range(2) if f"r{i}" != rid)
        assert (await _events(node, other))[1] == "length"
        await _assert_whole(node)


# ---- the receiving side -------------------------------------------------------------------------------
def _handed(engine, prompt: list[int]) -> HandedRequest:
    output = (11, 12, 13)
    computed = len(prompt) + len(output) - 1
    keys = tuple(engine.fingerprint + bytes([i]) * 16 for i in range(-(-computed // 16)))  # never stored
    return HandedRequest("adopted", tuple(prompt), output, GREEDY, computed, keys)


async def _silent_listener():
    """A TCP port that accepts and never answers: a cache-store that hangs."""
    server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_an_adoption_whose_kv_cannot_be_fetched_or_is_cancelled_leaves_nothing(fp32_model, bundled_tokenizer,
                                                                                     store, prompts):
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=16)
    node = DecodeNode(engine, num_threads=2)
    node.start()
    silent, silent_address = await _silent_listener()
    try:
        handed = _handed(engine, prompts[0])
        with pytest.raises(UnavailableError, match="NOT_FOUND"):
            await node.adopt(handed, store)
        await _assert_whole(node)
        assert "adopted" not in node.streams

        task = asyncio.create_task(node.adopt(handed, silent_address))
        await _eventually(lambda: "adopted" in engine.reservations.reservations, what="blocks granted")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _assert_whole(node)
        assert "adopted" not in node.streams

        node.draining = True
        with pytest.raises(UnavailableError, match="draining"):
            await node.adopt(handed, store)
    finally:
        silent.close()
        await node.stop()
        for client in node.stores.clients.values():
            with contextlib.suppress(grpc.aio.UsageError):
                await client.close()

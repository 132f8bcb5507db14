"""The prefill node's CUDA IPC handshake state machine, per decode node: offer once, ready or fall back
(refused, unreachable, wrong digest, no pool, a failed copy), retry after a while; concurrent requests
share one offer."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
import torch
from pdserve.v1 import node_pb2

from kvcache.cuda_ipc import IpcError, probe_digest, probe_pattern
from services.engine_node.kv_ipc_wire import IpcAnswer, IpcOffer
from services.prefill_node.kv_ipc import IpcLinks, LinkState
from tests.ipc_fakes import FakeIpc

LAYOUT = node_pb2.KVLayout(dtype="float32", block_size=4, num_layers=1, num_kv_heads=1, head_dim=2)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Peer:
    """Answers offers as told; counts them."""

    def __init__(self, answer: str = "accept", delay: float = 0.0) -> None:
        self.answer = answer
        self.delay = delay
        self.offers: list[tuple[str, IpcOffer]] = []

    async def __call__(self, address: str, offer: IpcOffer) -> IpcAnswer:
        self.offers.append((address, offer))
        await asyncio.sleep(self.delay)
        if self.answer == "unreachable":
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="connection refused")
        if self.answer == "unimplemented":
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="Method not found!")
        if self.answer == "refuse":
            return IpcAnswer(accepted=False, reason="another GPU")
        digest = probe_digest(probe_pattern(offer.probe_nonce))
        return IpcAnswer(accepted=True, probe_digest=digest if self.answer == "accept" else b"wrong")


def links(peer: Peer, clock: Clock | None = None, export=None) -> IpcLinks:
    ipc = FakeIpc()
    exports = []

    def make():
        exports.append(1)
        return ipc.pool_export(torch.zeros(1, 4, 2, 4, 1, 2), LAYOUT)

    made = IpcLinks(export or make, peer, retry_after_s=60, clock=clock or Clock())
    made.exports = exports  # type: ignore[attr-defined]
    return made


async def test_accepted_offer_makes_the_link_ready_and_is_not_repeated() -> None:
    peer = Peer()
    link = links(peer)
    assert link.state("d1") is LinkState.UNTRIED
    first = await link.session_for("d1")
    assert first == peer.offers[0][1].session_id and link.state("d1") is LinkState.READY
    assert await link.session_for("d1") == first
    second = await link.session_for("d2")  # one exported pool, an offer (and a fresh session id) per peer
    assert second == peer.offers[1][1].session_id != first
    assert [a for a, _ in peer.offers] == ["d1", "d2"] and len(link.exports) == 1


async def test_concurrent_requests_share_one_offer() -> None:
    peer = Peer(delay=0.05)
    link = links(peer)
    sessions = await asyncio.gather(*(link.session_for("d1") for _ in range(5)))
    assert sessions == [peer.offers[0][1].session_id] * 5 and len(peer.offers) == 1


@pytest.mark.parametrize(("answer", "reason"), [
    ("refuse", "refused: another GPU"), ("unreachable", "UNAVAILABLE"), ("unimplemented", "UNIMPLEMENTED"),
    ("bad-digest", "read the probe wrong"),
])
async def test_every_failed_handshake_falls_back_then_retries_later(answer: str, reason: str) -> None:
    peer, clock = Peer(answer), Clock()
    link = links(peer, clock)
    assert await link.session_for("d1") is None
    assert link.state("d1") is LinkState.FALLBACK and reason in link.links["d1"].reason
    clock.now = 59.0
    assert await link.session_for("d1") is None and len(peer.offers) == 1  # bytes, no new offer yet
    clock.now = 61.0
    peer.answer = "accept"
    again = await link.session_for("d1")
    assert len(peer.offers) == 2 and again == peer.offers[1][1].session_id != peer.offers[0][1].session_id


async def test_a_failed_transfer_turns_a_ready_link_to_bytes() -> None:
    peer, clock = Peer(), Clock()
    link = links(peer, clock)
    assert await link.session_for("d1")
    link.fail("d1", "no CUDA IPC session (restarted?)")
    assert link.state("d1") is LinkState.FALLBACK and await link.session_for("d1") is None
    link.fail("d1", "again")  # already falling back: the first reason stays
    assert "restarted" in link.links["d1"].reason
    clock.now = 100.0  # a new handshake, under a new session id: the decode node's stale one is its caller's
    assert await link.session_for("d1") == peer.offers[1][1].session_id != peer.offers[0][1].session_id


@pytest.mark.parametrize("export", [lambda: None, "raises"])
async def test_no_exportable_pool_means_bytes_for_good(export) -> None:
    def broken():
        raise IpcError("only CUDA tensors have IPC handles")

    peer, clock = Peer(), Clock()
    link = links(peer, clock, export=broken if export == "raises" else export)
    assert await link.session_for("d1") is None
    clock.now = 10**9
    assert await link.session_for("d1") is None and await link.session_for("d2") is None
    assert not peer.offers
    assert ("exporting the pool failed" if export == "raises" else "no CUDA pool") in link.links["d1"].reason


def test_a_cpu_pool_is_not_exported() -> None:
    from services.prefill_node.kv_ipc import export_pool

    with pytest.raises(IpcError, match="only CUDA pools"):
        export_pool(torch.zeros(1, 4, 2, 4, 1, 2), LAYOUT)

"""A prefill identity against another request's grant on a decode node: without the grant's token it can
neither write into the granted blocks, nor commit, nor renew the lease, nor abort it — every such message
is refused PERMISSION_DENIED naming "grant token" (never the token), changes nothing, and the rightful
request completes with the right tokens. Real gRPC with mTLS on loopback: the pair's prefill node holds
the test identity (common name "test"); the intruder holds a prefill-only certificate (common name
"prefill"). A tiny random model on the CPU."""

from __future__ import annotations

import asyncio
import collections
import secrets

import grpc
import grpc.aio
import pytest
from pdserve.v1 import decode_pb2_grpc, node_pb2

from services.common.tls.channels import open_channel
from services.decode_node.node import DecodeNode
from services.engine_node.kv_layout import kv_layout
from services.prefill_node.node import PrefillNode
from tests.decode_node.kv_messages import blocks, commit, header, keepalive, reserve, transfer
from tests.prefill_node.node_pair import GREEDY, PROMPT, engine, generate, idle, serving
from tests.tls_identities import identity_of

DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]


class HeldFetch:
    """A cache-store lookup that waits until the test lets it go (and finds nothing): the request's grant
    is live and its header sent meanwhile (the prefill node's ``PrefixStore`` face)."""

    write_through = False

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def fetch(self, request_id, num_prompt_tokens, block_hashes, local):
        await self.release.wait()
        return None

    async def close(self) -> None:
        pass


async def _until(predicate, what: str) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def _count_renewals(decode: DecodeNode) -> collections.Counter[str]:
    """Leases renewed (headers, keepalives) per request id, counted as they happen."""
    counts: collections.Counter[str] = collections.Counter()
    renew = decode.renew

    async def counted(request_id: str) -> int:
        lease = await renew(request_id)
        counts[request_id] += 1
        return lease

    decode.renew = counted
    return counts


def _denied(acks, token: bytes) -> None:
    for ack in acks:
        assert ack.code == DENIED and "grant token" in ack.error, ack
        assert token.hex() not in ack.error and repr(token) not in ack.error


async def test_another_prefill_identity_cannot_write_commit_renew_or_abort_a_grant(model, expected):
    store = HeldFetch()
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model), prefix_store=store)
    async with serving(prefill, decode) as address, \
            open_channel(address, "decode", identity=identity_of("prefill")) as channel:
        intruder = decode_pb2_grpc.DecodeNodeStub(channel)
        headers = _count_renewals(decode)
        victim = asyncio.create_task(generate(prefill, decode, address, "victim"))
        await _until(lambda: headers["victim"] == 1, "the victim's header")  # then it waits for the fetch
        layout = kv_layout(decode.engine.kv_layout_spec())
        reservation = decode.engine.reservations.reservations["victim"]
        targets, deadline = list(reservation.pending_block_ids), reservation.lease_deadline
        forged = secrets.token_bytes(32)
        garbage = secrets.token_bytes(len(targets) * layout.bytes_per_block)
        _denied(await transfer(intruder, header("victim", layout), header("victim", layout, forged),
                               blocks("victim", targets, garbage), keepalive("victim"), keepalive("victim", forged),
                               commit("victim", forged), commit("victim")), forged)
        mine = await intruder.Reserve(reserve("mine"))  # the intruder's own grant opens nothing else
        assert mine.granted and len(mine.grant_token) == 32 and mine.grant_token != forged
        acks = await transfer(intruder, header("mine", layout, mine.grant_token),
                              header("victim", layout, mine.grant_token), blocks("victim", targets[:1], garbage[:0]),
                              blocks("mine", targets[:1], garbage[:layout.bytes_per_block]))
        assert not acks[0].error
        _denied(acks[1:3], mine.grant_token)
        assert acks[3].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and acks[3].error.startswith("block_ids")
        for token in (b"", forged, mine.grant_token):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await intruder.Abort(node_pb2.AbortRequest(request_id="victim", grant_token=token))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "grant token" in info.value.details()
        assert decode.grants.live("victim") and reservation.received.isdisjoint(targets)
        assert reservation.lease_deadline == deadline  # nothing of the intruder's renewed it
        store.release.set()
        tokens, _ = await victim
        assert tokens == expected
        await idle(decode)


async def test_a_commit_without_the_token_is_refused_and_the_holder_commits_after(model):
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model))
    async with serving(prefill, decode) as address, \
            open_channel(address, "decode", identity=identity_of("prefill")) as channel:
        stub = decode_pb2_grpc.DecodeNodeStub(channel)
        layout = kv_layout(decode.engine.kv_layout_spec())
        grant = await stub.Reserve(reserve("held"))
        ids = list(grant.block_ids)[grant.num_cached_blocks:]
        forged = secrets.token_bytes(32)
        acks = await transfer(stub, header("held", layout, grant.grant_token),
                              blocks("held", ids, bytes(len(ids) * layout.bytes_per_block)),
                              commit("held", num_computed_tokens=len(PROMPT)),
                              commit("held", forged, num_computed_tokens=len(PROMPT)))
        assert not acks[0].error and not acks[1].error
        _denied(acks[2:], forged)
        assert not any(ack.committed for ack in acks)
        assert decode.grants.live("held") and not decode.engine.has_unfinished()  # nothing committed
        acks = await transfer(stub, commit("held", grant.grant_token, num_computed_tokens=len(PROMPT)))
        assert acks[0].committed and not acks[0].error
        events = [event async for event in decode.attach("held")]
        assert events[-1].finish_reason == "length"
        assert sum(len(e.token_ids) for e in events) == GREEDY.max_tokens - 1
        await idle(decode)


async def test_keepalives_without_the_token_do_not_renew_the_lease(model):
    """Keepalives that do not present the grant's token go on for as long as the grant lives: it expires
    after its 1 s lease anyway, as if nobody had sent anything."""
    decode, prefill = DecodeNode(engine(model), default_lease_s=1.0), PrefillNode(engine(model))
    async with serving(prefill, decode) as address, \
            open_channel(address, "decode", identity=identity_of("prefill")) as channel:
        stub = decode_pb2_grpc.DecodeNodeStub(channel)
        grant = await stub.Reserve(reserve("held"))
        reservation = decode.engine.reservations.reservations["held"]
        deadline, forged = reservation.lease_deadline, secrets.token_bytes(32)

        async def pump():
            seq = 0
            while decode.grants.live("held") and seq < 200:  # 10 s: it would have expired ten times
                seq += 1
                yield keepalive("held", forged if seq % 2 else b"")
                yield keepalive("held", forged if seq % 2 else b"")
                await asyncio.sleep(0.05)

        acks = []
        async for ack in stub.TransferKV(_numbered(pump())):
            acks.append(ack)
            assert reservation.lease_deadline == deadline
        assert any(ack.code == DENIED for ack in acks)
        assert all(ack.code in (DENIED, grpc.StatusCode.NOT_FOUND.value[0]) for ack in acks)
        assert not decode.engine.reservations.reservations  # expired: its blocks went back
        late = await transfer(stub, keepalive("held", grant.grant_token))
        assert late[0].code == grpc.StatusCode.NOT_FOUND.value[0]
        await idle(decode)


async def _numbered(messages):
    seq = 0
    async for message in messages:
        seq += 1
        message.seq = seq
        yield message

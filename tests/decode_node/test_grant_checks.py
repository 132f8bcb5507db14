"""The decode node's checks around grants: bounds per caller (live grants, blocks), seq order on a KV stream,
a header's IPC session (accepted here, by the same caller), Reserve's deadline and lease, who may
abort a grant, and no new request under the id of a token stream the node still keeps. Each refusal
changes nothing and every pool ends idle. Real gRPC with mTLS on loopback:
callers are the test identity (common name "test", every role) and single-role certificates of the
session CA (common names "prefill", "gateway"). A tiny random model on the CPU."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import torch
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common.sampling_convert import sampling_to_proto
from services.common.tls.channels import open_channel
from services.decode_node.kv_ipc import _Session
from services.decode_node.node import DecodeNode
from services.engine.random_llama import PRESETS, random_model
from services.engine.sampling_params import SamplingParams
from services.engine_node.kv_layout import kv_layout
from services.prefill_node.node import FirstToken, PrefillNode
from tests.conftest import make_engine
from tests.decode_node.kv_messages import blocks, commit, header, keepalive, reserve, transfer
from tests.prefill_node.node_pair import GREEDY, PROMPT, engine, generate, idle, serving, slow_steps
from tests.tls_identities import identity_of

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def model():
    return random_model(PRESETS["tiny"], torch.float32)


@contextlib.asynccontextmanager
async def node(model, **settings) -> AsyncIterator[tuple[DecodeNode, dict[str, decode_pb2_grpc.DecodeNodeStub]]]:
    """A decode node (64 blocks of 4 tokens) and stubs to it as "test" (every role), "prefill", "gateway"."""
    decode, prefill = DecodeNode(engine(model), default_lease_s=30, **settings), PrefillNode(engine(model))
    async with contextlib.AsyncExitStack() as stack:
        address = await stack.enter_async_context(serving(prefill, decode))
        stubs = {}
        for name, identity in (("test", True), ("prefill", identity_of("prefill")),
                               ("gateway", identity_of("gateway"))):
            channel = await stack.enter_async_context(open_channel(address, "decode", identity=identity))
            stubs[name] = decode_pb2_grpc.DecodeNodeStub(channel)
        yield decode, stubs


async def _abort_all(decode: DecodeNode, gateway: decode_pb2_grpc.DecodeNodeStub) -> None:
    for rid in list(decode.grants.records):
        assert (await gateway.Abort(node_pb2.AbortRequest(request_id=rid))).found  # no token from a gateway
    await idle(decode)
    assert not decode.grants.records


async def test_each_caller_is_bounded_in_live_grants_and_blocks_and_others_still_get_grants(model):
    """2 live grants per caller, 0.3 of the 64 blocks = 19: a 12-block prompt fits once, 2-block ones after."""
    async with node(model, max_reservations_per_caller=2, max_reserved_blocks_fraction=0.3) as (decode, stubs):
        a, b, short = stubs["prefill"], stubs["test"], PROMPT[:8]
        first = await a.Reserve(reserve("a1"))
        assert first.granted
        refused = await a.Reserve(reserve("a2"))
        assert not refused.granted and refused.reason.startswith("max_reserved_blocks_per_caller"), refused
        assert (await a.Reserve(reserve("a3", prompt_token_ids=short))).granted
        refused = await a.Reserve(reserve("a4", prompt_token_ids=short))
        assert not refused.granted and refused.reason.startswith("max_reservations_per_caller"), refused
        assert "a2" not in decode.engine.reservations.reservations and len(decode.engine.reservations.waiters) == 0
        assert decode.grants.held_by("cn:prefill") == (2, 14)
        assert (await b.Reserve(reserve("b1"))).granted  # another caller is not bound by a's grants
        assert (await b.Reserve(reserve("b2", prompt_token_ids=short))).granted
        assert (await a.Abort(node_pb2.AbortRequest(request_id="a1", grant_token=first.grant_token))).found
        assert (await a.Reserve(reserve("a4", prompt_token_ids=short))).granted  # only live grants count
        assert set(decode.engine.reservations.reservations) == {"a3", "a4", "b1", "b2"}
        await _abort_all(decode, stubs["gateway"])


async def test_a_caller_holds_at_most_its_fraction_of_the_decode_slots(model):
    """Grants take decode slots (max_num_seqs). One caller holding them all refused everyone else "no free
    slot" for as long as its keepalives went on (found by review); it gets half of 8 now (the default
    fraction), the other callers the rest."""
    decode = DecodeNode(make_engine(model, None, num_kv_blocks=64, max_num_batched_tokens=16, block_size=4,
                                    max_num_seqs=8), default_lease_s=30)
    async with serving(PrefillNode(engine(model)), decode) as address, \
            open_channel(address, "decode", identity=identity_of("prefill")) as as_prefill:
        hostile, short = decode_pb2_grpc.DecodeNodeStub(as_prefill), PROMPT[:4]
        for i in range(4):
            assert (await hostile.Reserve(reserve(f"h{i}", prompt_token_ids=short))).granted
        refused = await hostile.Reserve(reserve("h4", prompt_token_ids=short))
        assert not refused.granted and refused.reason.startswith("max_reservations_per_caller"), refused
        assert "h4" not in decode.engine.reservations.reservations
        async with open_channel(address, "decode") as as_test:
            other = decode_pb2_grpc.DecodeNodeStub(as_test)
            for i in range(4):
                assert (await other.Reserve(reserve(f"o{i}", prompt_token_ids=short))).granted
            async with open_channel(address, "decode", identity=identity_of("gateway")) as as_gateway:
                await _abort_all(decode, decode_pb2_grpc.DecodeNodeStub(as_gateway))


async def test_requests_nobody_attaches_to_are_aborted_after_the_grace(model):
    """A gateway attaches as soon as a request is reserved or adopted. A prefill identity that commits and
    moves on (its grant no longer counts against it), or a tokens-only adoption nobody follows, kept decode
    slots busy decoding to max_tokens for nobody (found by review): now such a request is aborted once the
    re-attach grace passes without an Attach, and every pool is idle again. One the gateway attached to
    runs to its end."""
    long = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    decode = DecodeNode(engine(model), default_lease_s=30, reattach_grace_s=0.5)
    slow_steps(decode, 0.02)  # 100 tokens take 2 s: running when the grace passes
    async with serving(PrefillNode(engine(model)), decode) as address, \
            open_channel(address, "decode", identity=identity_of("prefill")) as as_prefill, \
            open_channel(address, "decode", identity=identity_of("gateway")) as as_gateway:
        prefill, gateway = decode_pb2_grpc.DecodeNodeStub(as_prefill), decode_pb2_grpc.DecodeNodeStub(as_gateway)
        layout = kv_layout(decode.engine.kv_layout_spec())
        grant = await prefill.Reserve(reserve("committed", prompt_token_ids=PROMPT[:8],
                                              sampling=sampling_to_proto(long), max_tokens=100))
        ids = list(grant.block_ids)[grant.num_cached_blocks:]
        acks = await transfer(prefill, header("committed", layout, grant.grant_token),
                              blocks("committed", ids, bytes(len(ids) * layout.bytes_per_block)),
                              commit("committed", grant.grant_token))
        assert not any(ack.error for ack in acks) and acks[-1].committed
        adopted = decode_pb2.AdoptRequest(request_id="adopted", prompt_token_ids=PROMPT[:8], output_token_ids=[1],
                                          sampling=sampling_to_proto(long))
        assert (await gateway.Adopt(adopted)).granted
        assert (await prefill.Reserve(reserve("read"))).granted  # a gateway reads this one
        reading = gateway.Attach(decode_pb2.AttachRequest(request_id="read"))
        while not decode.streams["read"].was_attached:
            await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # past the grace
        assert "committed" not in decode.streams and "adopted" not in decode.streams
        assert not decode.engine.holds("committed") and not decode.engine.holds("adopted")
        assert decode.grants.live("read")  # attached: left alone
        assert (await gateway.Abort(node_pb2.AbortRequest(request_id="read"))).found
        reading.cancel()
        await idle(decode)


async def test_a_seq_not_increasing_is_refused_and_changes_nothing(model):
    async with node(model) as (decode, stubs):
        grant = await stubs["test"].Reserve(reserve("r"))
        layout, token = kv_layout(decode.engine.kv_layout_spec()), grant.grant_token
        acks = await transfer(stubs["test"], header("r", layout, token), keepalive("r", token),
                              keepalive("r", token), keepalive("r", token), seqs=[5, 5, 3, 6])
        assert not acks[0].error and not acks[3].error
        for ack in acks[1:3]:
            assert ack.code == Code.INVALID_ARGUMENT.value[0] and ack.error.startswith("seq:"), ack
        assert [ack.seq for ack in acks] == [5, 5, 3, 6]
        assert decode.grants.live("r")  # the request was not failed by the stream's fault
        await _abort_all(decode, stubs["gateway"])


async def test_a_header_may_name_only_an_ipc_session_its_caller_opened_here(model):
    async with node(model) as (decode, stubs):
        grant = await stubs["test"].Reserve(reserve("r"))
        layout, token, pool = kv_layout(decode.engine.kv_layout_spec()), grant.grant_token, decode.engine.kv_pool
        decode.ipc.sessions["theirs"] = _Session(None, pool, owner="cn:prefill")  # as OpenKVIpc records them
        decode.ipc.sessions["mine"] = _Session(None, pool, owner="cn:test")
        acks = await transfer(stubs["test"], header("r", layout, token, ipc_session="unknown"),
                              header("r", layout, token, ipc_session="theirs"),
                              header("r", layout, token, ipc_session="mine"))
        assert acks[0].code == Code.INVALID_ARGUMENT.value[0] and acks[0].error.startswith("ipc_session:"), acks[0]
        assert acks[1].code == Code.PERMISSION_DENIED.value[0] and acks[1].error.startswith("ipc_session:"), acks[1]
        assert not acks[2].error and decode.grants.live("r")
        decode.ipc.close()
        await _abort_all(decode, stubs["gateway"])


async def test_reserve_refuses_a_past_deadline_and_clamps_a_long_lease(model):
    async with node(model) as (decode, stubs):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs["test"].Reserve(reserve("late", deadline_unix_ms=int(time.time() * 1000) - 1000))
        assert info.value.code() == Code.INVALID_ARGUMENT and info.value.details().startswith("deadline_unix_ms:")
        assert not decode.grants.records and not decode.engine.reservations.reservations
        grant = await stubs["test"].Reserve(reserve("long", lease_ms=4_000_000_000))
        assert grant.granted and grant.lease_ms == 30_000  # the node's own lease
        await _abort_all(decode, stubs["gateway"])


async def test_a_lease_passing_while_a_batch_is_written_does_not_free_its_blocks(model):
    """The engine thread marks a batch's blocks received, then the event loop writes its bytes. Expiry
    (engine thread, every tick) freed a reservation whose lease passed in between: the bytes then landed in
    blocks back in the free pool (found by review, with a slow write and the 1 ms lease a Reserve could ask).
    Now a reservation is not expired while a batch of it is written, and a lease asked shorter than 1 s (or
    than the node's own lease) is raised to it."""
    async with node(model) as (decode, stubs):
        decode.default_lease_s = 0.2  # the node's lease: the floor for asks below 1 s
        grant = await stubs["prefill"].Reserve(reserve("r", lease_ms=1))
        assert grant.granted and grant.lease_ms == 200
        written, write = {}, decode.engine.write_kv_blocks

        def slow_write(block_ids, payload):
            time.sleep(0.5)  # the lease passes; the engine thread ticks every 50 ms meanwhile
            written["reserved"] = "r" in decode.engine.reservations.reservations
            return write(block_ids, payload)

        decode.engine.write_kv_blocks = slow_write
        layout = kv_layout(decode.engine.kv_layout_spec())
        ids = list(grant.block_ids)[grant.num_cached_blocks:]
        acks = await transfer(stubs["prefill"], header("r", layout, grant.grant_token),
                              blocks("r", ids, bytes(len(ids) * layout.bytes_per_block)))
        assert written == {"reserved": True} and not acks[1].error, acks
        for _ in range(100):  # no more traffic: now the lease passes, and the reservation expires
            if not decode.grants.records:
                break
            await asyncio.sleep(0.02)
        assert not decode.grants.records
        await idle(decode)


async def test_a_prefill_caller_aborts_only_with_the_grant_token(model):
    async with node(model) as (decode, stubs):
        prefill = stubs["prefill"]
        grant = await prefill.Reserve(reserve("r"))
        for token in (b"", secrets.token_bytes(32)):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await prefill.Abort(node_pb2.AbortRequest(request_id="r", grant_token=token))
            assert info.value.code() == Code.PERMISSION_DENIED and info.value.details().startswith("grant token:")
        assert decode.grants.live("r") and "r" in decode.engine.reservations.reservations
        assert not (await prefill.Abort(node_pb2.AbortRequest(request_id="unknown"))).found
        assert (await prefill.Abort(node_pb2.AbortRequest(request_id="r", grant_token=grant.grant_token))).found
        await idle(decode)
        await prefill.Reserve(reserve("r2"))
        await _abort_all(decode, stubs["gateway"])  # a gateway needs no token


async def test_no_reserve_or_adopt_takes_the_id_of_a_stream_its_gateway_has_not_read(model):
    """A request finished before its gateway attached: its tokens wait in its stream. A Reserve (a prefill
    identity) or a tokens-only Adopt (a gateway identity) under its id would replace that stream, and the
    gateway's Attach would read the newcomer's tokens. Both are refused by name; the gateway reads the
    request's own tokens. Once it has, the id is free again: a client may reuse its request ids."""
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model))
    async with serving(prefill, decode) as address, \
            open_channel(address, "decode", identity=identity_of("prefill")) as as_prefill, \
            open_channel(address, "decode", identity=identity_of("gateway")) as as_gateway:
        events = [e async for e in prefill.prefill("victim", PROMPT, GREEDY, [address], timeout_s=30)]
        first = next(e for e in events if isinstance(e, FirstToken))
        for _ in range(400):
            if decode.streams["victim"].finished:
                break
            await asyncio.sleep(0.01)
        expected = [first.token_id, *decode.streams["victim"].queue.tokens]
        prefill_stub = decode_pb2_grpc.DecodeNodeStub(as_prefill)
        gateway_stub = decode_pb2_grpc.DecodeNodeStub(as_gateway)
        adopt = decode_pb2.AdoptRequest(request_id="victim", prompt_token_ids=PROMPT[:8], output_token_ids=[1],
                                        sampling=sampling_to_proto(GREEDY))

        async def refused() -> None:
            for call in (prefill_stub.Reserve(reserve("victim", prompt_token_ids=PROMPT[:8])),
                         gateway_stub.Adopt(adopt)):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == Code.INVALID_ARGUMENT, info.value
                assert info.value.details().startswith("request_id:"), info.value.details()
            assert not decode.grants.records and not decode.engine.reservations.reservations

        await refused()
        read = [t async for event in gateway_stub.Attach(decode_pb2.AttachRequest(request_id="victim"))
                for t in event.token_ids]
        assert [first.token_id, *read] == expected
        assert (await prefill_stub.Reserve(reserve("victim", prompt_token_ids=PROMPT[:8]))).granted  # read: free
        assert (await gateway_stub.Abort(node_pb2.AbortRequest(request_id="victim"))).found
        await idle(decode)


async def test_a_client_reuses_a_request_id_once_its_request_finished(model):
    """The gateway runs a client's first attempt under the client's own id, and a client may send the next
    request under the same id once the first ended (found by review: refused for the re-attach grace)."""
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model))
    async with serving(prefill, decode) as address:
        first, _ = await generate(prefill, decode, address, "reused")
        second, _ = await generate(prefill, decode, address, "reused")
        assert first == second and len(first) == GREEDY.max_tokens
        await idle(decode)

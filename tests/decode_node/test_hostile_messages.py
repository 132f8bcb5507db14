"""A buggy or hostile peer's messages to the decode node: every malformed field is refused with a status
naming it, nothing is left held (the pool idle, the block accounting intact), and the node goes on serving.
The known kill: a commit whose first token is outside the vocabulary reached the engine and failed its
thread; it is refused INVALID_ARGUMENT now and the engine thread lives. Real gRPC on loopback, a tiny
random model on the CPU (the prefill/decode pair harness)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import torch
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common.sampling_convert import sampling_to_proto
from services.common.tls.channels import open_channel
from services.decode_node.node import DecodeNode
from services.engine.random_llama import PRESETS, random_model
from services.engine_node.kv_layout import kv_layout
from services.prefill_node.node import PrefillNode
from tests.decode_node.kv_messages import blocks as _blocks
from tests.decode_node.kv_messages import commit, header, transfer
from tests.decode_node.kv_messages import reserve as _reserve
from tests.prefill_node.node_pair import GREEDY, PROMPT, engine, generate, idle, serving

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def model():
    return random_model(PRESETS["tiny"], torch.float32)


@contextlib.asynccontextmanager
async def node(model) -> AsyncIterator[tuple[decode_pb2_grpc.DecodeNodeStub, DecodeNode, PrefillNode]]:
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model))
    async with serving(prefill, decode) as address, open_channel(address, "decode") as channel:
        yield decode_pb2_grpc.DecodeNodeStub(channel), decode, prefill


async def _still_serves(decode: DecodeNode, prefill: PrefillNode, address: str, expected_len: int = 6) -> None:
    await idle(decode)
    tokens, _ = await generate(prefill, decode, address, "after")
    assert len(tokens) == expected_len
    await idle(decode)


async def _refused(call, code: grpc.StatusCode, field: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value
    assert info.value.details().startswith(field) or f"{field}:" in info.value.details(), info.value.details()
    return info.value.details()


async def test_reserve_attach_abort_and_adopt_refuse_malformed_fields_by_name(model):
    vocab = model.config.vocab_size
    async with node(model) as (stub, decode, prefill):
        for rid in ("", "x" * 257, "bad\nid", "nul\x00"):
            await _refused(stub.Reserve(_reserve(rid)), Code.INVALID_ARGUMENT, "request_id")
            await _refused(stub.Abort(node_pb2.AbortRequest(request_id=rid)), Code.INVALID_ARGUMENT, "request_id")
            attach = stub.Attach(decode_pb2.AttachRequest(request_id=rid))
            await _refused(attach.read(), Code.INVALID_ARGUMENT, "request_id")
        answer = await stub.Abort(node_pb2.AbortRequest(request_id="unknown", reason="why\n" * 300))
        assert not answer.found  # an abort is never refused for its (informative) reason
        await _refused(stub.Reserve(_reserve(prompt_token_ids=[*PROMPT[:-1], vocab])), Code.INVALID_ARGUMENT,
                       "token_ids")
        mine = kv_layout(decode.engine.kv_layout_spec())
        await _refused(stub.Reserve(_reserve(block_hashes=[b"h" * 16] * 12, layout=mine)), Code.INVALID_ARGUMENT,
                       "block_hashes")  # 45 tokens fill 11 blocks of 4
        await _refused(stub.Reserve(_reserve(block_hashes=[b"h" * 65])), Code.INVALID_ARGUMENT, "block_hashes[0]")
        await _refused(stub.Reserve(_reserve(decode_peers=["no-port"])), Code.INVALID_ARGUMENT, "decode_peers[0]")
        await _refused(stub.Reserve(_reserve(decode_peers=["h:1"] * 65)), Code.INVALID_ARGUMENT, "decode_peers")
        theirs = kv_layout(decode.engine.kv_layout_spec())
        theirs.model_fingerprint = bytes(16)
        details = await _refused(stub.Reserve(_reserve(layout=theirs)), Code.FAILED_PRECONDITION,
                                 "layout.model_fingerprint")
        assert decode.engine.fingerprint.hex() not in details and bytes(16).hex() not in details
        fingerprint = decode.engine.fingerprint
        adopt = decode_pb2.AdoptRequest(request_id="adopted", prompt_token_ids=PROMPT, output_token_ids=[1],
                                        sampling=sampling_to_proto(GREEDY), model_fingerprint=fingerprint,
                                        num_computed_tokens=len(PROMPT), cache_store="127.0.0.1:1")
        for field, bad in (("kv_keys[0]", dict(kv_keys=[b"short"])), ("kv_keys[0]", dict(kv_keys=[bytes(32)])),
                           ("cache_store", dict(cache_store="nowhere")), ("request_id", dict(request_id="a\tb")),
                           ("output_token_ids", dict(output_token_ids=[vocab]))):
            request = decode_pb2.AdoptRequest()
            request.CopyFrom(adopt)
            for name, value in bad.items():
                if isinstance(value, list):
                    getattr(request, name)[:] = value
                else:
                    setattr(request, name, value)
            await _refused(stub.Adopt(request), Code.INVALID_ARGUMENT, field)
        await _still_serves(decode, prefill, decode.address)


async def test_transfer_messages_with_bad_fields_are_refused_by_name_and_free_the_reservation(model):
    async with node(model) as (stub, decode, prefill):
        layout = kv_layout(decode.engine.kv_layout_spec())
        size = layout.bytes_per_block
        acks = await transfer(stub, header("never-reserved", layout), header("bad id\n", layout))
        assert grpc.StatusCode.NOT_FOUND.value[0] == acks[0].code and "never-reserved" in acks[0].error
        assert acks[1].code == Code.INVALID_ARGUMENT.value[0] and acks[1].error.startswith("header.request_id")
        cases = (
            (lambda ids: [ids[0], ids[0]], lambda n: 2 * n, "blocks.block_ids"),  # a block twice in a batch
            (lambda ids: [ids[0]], lambda n: n - 1, "blocks.payload"),  # a short payload
            (lambda ids: [9999], lambda n: n, "block_ids"),  # a block outside the grant
            (lambda ids: [], lambda n: 0, "blocks.block_ids"),  # an empty batch
        )
        for i, (pick, payload_size, field) in enumerate(cases):
            grant = await stub.Reserve(_reserve(f"r{i}"))
            assert grant.granted
            acks = await transfer(stub, header(f"r{i}", layout, grant.grant_token),
                                  _blocks(f"r{i}", pick(list(grant.block_ids)), bytes(payload_size(size))))
            assert not acks[0].error
            assert acks[1].code == Code.INVALID_ARGUMENT.value[0] and acks[1].error.startswith(field), acks[1]
            await idle(decode)  # the failed transfer's reservation is freed, nothing marked or leaked
        await _still_serves(decode, prefill, decode.address)


async def test_a_commit_with_a_first_token_outside_the_vocabulary_is_refused_and_the_node_serves_on(model):
    vocab = model.config.vocab_size
    async with node(model) as (stub, decode, prefill):
        layout = kv_layout(decode.engine.kv_layout_spec())
        for first_token, computed, field in ((vocab, 0, "commit.first_token_id"),
                                             (1, len(PROMPT) - 1, "commit.num_computed_tokens")):
            grant = await stub.Reserve(_reserve("poison"))
            ids = list(grant.block_ids)[grant.num_cached_blocks:]
            acks = await transfer(stub, header("poison", layout, grant.grant_token),
                                  _blocks("poison", ids, bytes(len(ids) * layout.bytes_per_block)),
                                  commit("poison", grant.grant_token, first_token, computed))
            assert not acks[0].error and not acks[1].error and not acks[2].committed
            assert acks[2].code == Code.INVALID_ARGUMENT.value[0] and acks[2].error.startswith(field), acks[2]
            assert not decode.worker.stopped and not decode.failure
            await idle(decode)
        await _still_serves(decode, prefill, decode.address)

"""A hybrid model's recurrent state on the KV stream (``KVState``), a prefill node and a decode node over real gRPC
on loopback with Qwen3.5's tiny checkpoint: a request prefilled there decodes here with transformers' tokens, and a
peer's bad state pieces are refused naming the field (a piece without its header on the stream: PERMISSION_DENIED,
nothing changed; another size: INVALID_ARGUMENT; a commit before the whole state: FAILED_PRECONDITION), each
leaving nothing held."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
import torch
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common.tls.channels import open_channel
from services.decode_node.node import DecodeNode
from services.engine.model.registry import model_class
from services.engine.weights import load_weights
from services.engine_node.kv_layout import kv_layout
from services.prefill_node.node import PrefillNode
from tests.decode_node.kv_messages import blocks, commit, header, reserve, transfer
from tests.engine.test_model_families import assert_matches
from tests.engine.tiny_families import greedy_full_forward, load_reference
from tests.prefill_node.node_pair import GREEDY, PROMPT, engine, generate, idle, serving

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def hybrid(family_dir):
    path = family_dir("qwen3_5")
    weights = load_weights(path)
    model = model_class(weights.config.architecture)(weights.config, weights.tensors, torch.float32)
    return model, greedy_full_forward(load_reference(path), PROMPT, GREEDY.max_tokens)


@contextlib.asynccontextmanager
async def _nodes(model) -> AsyncIterator[tuple[decode_pb2_grpc.DecodeNodeStub, DecodeNode, PrefillNode]]:
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model))
    async with serving(prefill, decode) as address, open_channel(address, "decode") as channel:
        yield decode_pb2_grpc.DecodeNodeStub(channel), decode, prefill


def _state(rid: str, offset: int, payload: bytes, total: int) -> decode_pb2.KVTransferMessage:
    return decode_pb2.KVTransferMessage(state=decode_pb2.KVState(request_id=rid, offset=offset, payload=payload,
                                                                 total_bytes=total))


async def _idle(decode: DecodeNode) -> None:
    await idle(decode)
    assert not decode.engine.state_slots.holders()


async def test_the_state_crosses_the_stream_and_bad_pieces_are_refused_by_name(hybrid):
    model, expected = hybrid
    async with _nodes(model) as (stub, decode, prefill):
        tokens, _ = await generate(prefill, decode, decode.address, "good")
        assert_matches("qwen3_5/stream", expected, tokens)
        await _idle(decode)
        layout = kv_layout(decode.engine.kv_layout_spec())
        size = decode.engine.recurrent_states.bytes_per_slot

        grant = await stub.Reserve(reserve("no-header"))
        acks = await transfer(stub, _state("no-header", 0, bytes(8), size))  # not bound to a header here
        assert acks[0].code == Code.PERMISSION_DENIED.value[0] and "grant token" in acks[0].error, acks[0]
        assert "no-header" in decode.engine.reservations.reservations  # nothing changed
        await stub.Abort(node_pb2.AbortRequest(request_id="no-header"))
        await _idle(decode)

        for i, (piece, total, field) in enumerate(((bytes(8), size + 1, "state.total_bytes"),
                                                  (bytes(size + 1), size, "state.payload"))):
            grant = await stub.Reserve(reserve(f"bad{i}"))
            acks = await transfer(stub, header(f"bad{i}", layout, grant.grant_token),
                                  _state(f"bad{i}", 0, piece, total))
            assert not acks[0].error
            assert acks[1].code == Code.INVALID_ARGUMENT.value[0] and acks[1].error.startswith(field), acks[1]
            await _idle(decode)  # the failed transfer's reservation is freed

        grant = await stub.Reserve(reserve("stateless"))
        assert grant.num_cached_blocks > 0  # the prompt's full blocks, cached here by "good"
        ids = list(grant.block_ids)[grant.num_cached_blocks:]
        acks = await transfer(stub, header("stateless", layout, grant.grant_token),
                              blocks("stateless", ids, bytes(len(ids) * layout.bytes_per_block)),
                              commit("stateless", grant.grant_token, 1))
        assert not acks[1].error and not acks[2].committed
        assert acks[2].code == Code.FAILED_PRECONDITION.value[0] and "recurrent state" in acks[2].error, acks[2]
        await _idle(decode)
        tokens, _ = await generate(prefill, decode, decode.address, "after")  # serves on
        assert_matches("qwen3_5/after", expected, tokens)
        await _idle(decode)

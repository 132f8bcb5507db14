"""A prefill node and a decode node in one process, real gRPC, a tiny random model on the CPU, CUDA IPC
stood in for (tests/ipc_fakes.py): the prompt's blocks go by reference and the decode node copies them
out of the prefill node's pool; when a copy fails the blocks are sent again as bytes; when the decode
node takes no IPC everything goes as bytes. Every way, the output equals the mixed engine's."""

from __future__ import annotations

import contextlib

import pytest

from kvcache.cuda_ipc import IpcError
from services.decode_node.kv_ipc import IpcSessions
from services.decode_node.node import DecodeNode
from services.prefill_node import node as prefill_node_module
from services.prefill_node.kv_ipc import IpcLinks, LinkState
from services.prefill_node.node import PrefillNode
from tests.ipc_fakes import DECODE_ID, FakeIpc
from tests.prefill_node.node_pair import engine, generate, serving


@contextlib.asynccontextmanager
async def pair(model, decode_takes_ipc: bool = True):
    ipc = FakeIpc()
    decode = DecodeNode(engine(model))
    if decode_takes_ipc:
        pool = decode.engine.runner.kv_cache
        decode.ipc = IpcSessions(pool, decode.engine.kv_layout_spec(), DECODE_ID, opener=ipc.open)
    prefill = PrefillNode(engine(model), kv_ipc=True)
    assert prefill.ipc_links is None  # a CPU pool: no handshake at all, unless stood in for as here
    prefill.ipc_links = IpcLinks(lambda: ipc.pool_export(prefill.engine.runner.kv_cache, prefill.layout),
                                 prefill._offer_ipc)
    async with serving(prefill, decode) as address:
        yield prefill, decode, address


def spy_copies(decode: DecodeNode, fail: bool = False) -> list[list[int]]:
    copies: list[list[int]] = []
    real = decode.ipc.copy

    def copy(session_id, source_ids, block_ids):
        copies.append(list(block_ids))
        if fail:
            raise IpcError("copying 4 blocks failed: CUDA error: an illegal memory access was encountered")
        real(session_id, source_ids, block_ids)

    decode.ipc.copy = copy
    return copies


async def test_blocks_go_by_reference_and_the_output_matches(model, expected) -> None:
    async with pair(model) as (prefill, decode, address):
        copies = spy_copies(decode)
        tokens, done = await generate(prefill, decode, address, "r1")
        assert tokens == expected
        assert prefill.ipc_links.state(address) is LinkState.READY
        assert sorted(b for batch in copies for b in batch) == sorted(set(b for batch in copies for b in batch))
        assert sum(len(batch) for batch in copies) == done.kv_blocks_sent == 12  # the 45th token's block too
        tokens, _ = await generate(prefill, decode, address, "r2")  # a prefix hit on both sides this time
        assert tokens == expected


@pytest.mark.parametrize("blocks_per_message", [None, 3])
async def test_a_failed_copy_resends_bytes_and_turns_the_link_to_bytes(model, expected, blocks_per_message,
                                                                        monkeypatch) -> None:
    async with pair(model) as (prefill, decode, address):
        if blocks_per_message is not None:  # the resent bytes are split like any byte stream
            monkeypatch.setattr(prefill_node_module, "MAX_MESSAGE_PAYLOAD",
                                blocks_per_message * prefill.layout.bytes_per_block)
        received = decode.kv_received.blocks_total
        copies = spy_copies(decode, fail=True)
        tokens, done = await generate(prefill, decode, address, "r1")
        assert tokens == expected and done.kv_blocks_sent >= 12
        assert decode.kv_received.blocks_total - received == 12  # every block arrived once, as bytes
        assert copies and prefill.ipc_links.state(address) is LinkState.FALLBACK
        attempts = len(copies)
        tokens, _ = await generate(prefill, decode, address, "r2")
        assert tokens == expected and len(copies) == attempts  # bytes only now


async def test_a_decode_node_without_ipc_gets_bytes(model, expected) -> None:
    async with pair(model, decode_takes_ipc=False) as (prefill, decode, address):
        tokens, _ = await generate(prefill, decode, address, "r1")
        assert tokens == expected
        link = prefill.ipc_links.links[address]
        assert link.state is LinkState.FALLBACK and "takes no CUDA IPC" in link.reason

"""A grant outlives a wait on the prefill node: while a request waits there (its engine busy with other
prompts, or a slow cache-store lookup) the prefill node sends keepalives on the KV stream, so the decode
node's lease (0.3 s here) does not take the blocks back. A prefill node and a decode node in one process,
real gRPC, a tiny random model on the CPU."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import torch

from services.decode_node.node import DecodeNode
from services.decode_node.servicer import DecodeNodeServicer
from services.engine.random_llama import PRESETS, random_model
from services.prefill_node.node import PrefillNode
from tests.prefill_node.test_kv_ipc_transfer import GREEDY, PROMPT, _serve, engine, generate

LEASE_S = 0.3
WAIT_S = 4 * LEASE_S


@pytest.fixture(scope="module")
def model():
    return random_model(PRESETS["tiny"], torch.float32)


@pytest.fixture(scope="module")
def expected(model) -> list[int]:
    return engine(model).generate([PROMPT], GREEDY)[0].token_ids


class SlowStore:
    """A cache-store lookup that takes WAIT_S and finds nothing (the prefill node's ``PrefixStore`` face)."""

    write_through = False

    async def fetch(self, request_id, num_prompt_tokens, block_hashes, local):
        await asyncio.sleep(WAIT_S)
        return None

    async def close(self) -> None:
        pass


@contextlib.asynccontextmanager
async def pair(model, prefix_store=None, lease_s: float = LEASE_S):
    decode = DecodeNode(engine(model), default_lease_s=lease_s)
    server = await _serve(DecodeNodeServicer(decode))
    prefill = PrefillNode(engine(model), prefix_store=prefix_store)
    decode.start()
    prefill.start()
    try:
        yield prefill, decode, server.address
    finally:
        await prefill.stop()
        await decode.stop()
        await server.shutdown()


async def idle(decode: DecodeNode) -> None:
    engine = decode.engine
    await decode.worker.call(lambda e: None)  # the last step's bookkeeping is done
    assert not engine.reservations.reservations and not engine.has_unfinished()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    engine.check_integrity()


async def test_requests_queued_behind_other_prompts_keep_their_grants(model, expected):
    """Each prefill step takes LEASE_S / 2 here and each prompt 3 steps: the third request waits 6 steps
    (twice its lease) in the engine's queue before its first block goes out."""
    async with pair(model) as (prefill, decode, address):
        execute = prefill.engine.execute_step

        def slow_step(planned):
            time.sleep(LEASE_S / 2)
            return execute(planned)

        prefill.engine.execute_step = slow_step
        results = await asyncio.gather(*(generate(prefill, decode, address, f"queued-{i}") for i in range(3)))
        assert [tokens for tokens, _ in results] == [expected] * 3
        await idle(decode)


async def test_a_slow_cache_store_lookup_does_not_lose_the_grant(model, expected):
    async with pair(model, SlowStore()) as (prefill, decode, address):
        tokens, _ = await generate(prefill, decode, address, "slow-store")
        assert tokens == expected
        await idle(decode)


async def test_a_grant_nobody_keeps_alive_expires_and_the_attached_stream_says_why(model):
    """The other side of the lease: a prefill node that stops (dead, hung) sends no keepalive."""
    async with pair(model) as (_, decode, _address):
        grant = await decode.reserve("silent", PROMPT, GREEDY, lease_s=None)
        assert grant.block_ids
        events = [event async for event in decode.attach("silent")]
        assert [(e.finish_reason, e.token_ids) for e in events] == [("abort", [])]
        assert "lease expired" in events[0].abort_reason
        await idle(decode)

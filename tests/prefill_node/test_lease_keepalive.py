"""A grant outlives a wait on the prefill node: while a request waits there (its engine busy with other
prompts, or a slow cache-store lookup) the prefill node sends keepalives on the KV stream, so the decode
node's lease (0.3 s here) does not take the blocks back. A prefill node and a decode node in one process,
real gRPC, a tiny random model on the CPU."""

from __future__ import annotations

import asyncio

from tests.prefill_node.node_pair import GREEDY, PROMPT, generate, idle, pair, slow_steps

LEASE_S = 0.3
WAIT_S = 4 * LEASE_S


class SlowStore:
    """A cache-store lookup that takes WAIT_S and finds nothing (the prefill node's ``PrefixStore`` face)."""

    write_through = False

    async def fetch(self, request_id, num_prompt_tokens, block_hashes, local):
        await asyncio.sleep(WAIT_S)
        return None

    async def close(self) -> None:
        pass


async def test_requests_queued_behind_other_prompts_keep_their_grants(model, expected):
    """Each prefill step takes LEASE_S / 2 here and each prompt 3 steps: the third request waits 6 steps
    (twice its lease) in the engine's queue before its first block goes out."""
    async with pair(model, LEASE_S) as (prefill, decode, address):
        slow_steps(prefill, LEASE_S / 2)
        results = await asyncio.gather(*(generate(prefill, decode, address, f"queued-{i}") for i in range(3)))
        assert [tokens for tokens, _ in results] == [expected] * 3
        await idle(decode)


async def test_a_slow_cache_store_lookup_does_not_lose_the_grant(model, expected):
    async with pair(model, LEASE_S, SlowStore()) as (prefill, decode, address):
        tokens, _ = await generate(prefill, decode, address, "slow-store")
        assert tokens == expected
        await idle(decode)


async def test_a_grant_nobody_keeps_alive_expires_and_the_attached_stream_says_why(model):
    """The other side of the lease: a prefill node that stops (dead, hung) sends no keepalive."""
    async with pair(model, LEASE_S) as (_, decode, _address):
        grant = await decode.reserve("silent", PROMPT, GREEDY, lease_s=None)
        assert grant.block_ids
        events = [event async for event in decode.attach("silent")]
        assert [(e.finish_reason, e.token_ids) for e in events] == [("abort", [])]
        assert "lease expired" in events[0].abort_reason
        await idle(decode)

"""A request no decode node can ever take fails with the status that says so, not RESOURCE_EXHAUSTED
(which clients retry): a decode node whose KV layout differs from the prefill node's refuses it naming the
field (FAILED_PRECONDITION); one longer than every decode node's KV pool is INVALID_ARGUMENT. Nothing is
held anywhere afterwards. Real gRPC on loopback, a tiny random model on the CPU."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.errors import FailedPreconditionError, InvalidArgumentError
from services.decode_node.node import DecodeNode
from services.prefill_node.node import PrefillNode
from tests.conftest import make_engine
from tests.prefill_node.node_pair import GREEDY, PROMPT, idle, serving


async def test_a_decode_node_with_another_block_size_is_refused_by_name(model):
    decode = DecodeNode(make_engine(model, None, num_kv_blocks=32, max_num_batched_tokens=16, block_size=8))
    prefill = PrefillNode(make_engine(model, None, num_kv_blocks=64, max_num_batched_tokens=16, block_size=4))
    async with serving(prefill, decode) as address:
        with pytest.raises(FailedPreconditionError, match=r"layout\.block_size: sender has 4, this node 8"):
            async for _ in prefill.prefill("mismatched", PROMPT, GREEDY, [address], timeout_s=10):
                pass
        await idle(decode)
        assert not prefill.engine.has_unfinished() and len(prefill.live) == 0
        assert prefill.engine.kv.num_free_blocks == prefill.engine.kv.num_blocks


async def test_a_request_longer_than_every_decode_pool_is_invalid_argument(model):
    decode = DecodeNode(make_engine(model, None, num_kv_blocks=16, max_num_batched_tokens=16, block_size=4))
    prefill = PrefillNode(make_engine(model, None, num_kv_blocks=64, max_num_batched_tokens=16, block_size=4))
    too_long = dataclasses.replace(GREEDY, max_tokens=64)  # 45 + 64 tokens > 16 blocks of 4
    async with serving(prefill, decode) as address:
        with pytest.raises(InvalidArgumentError, match="exceed the KV pool of 64 tokens"):
            async for _ in prefill.prefill("too-long", PROMPT, too_long, [address], timeout_s=10):
                pass
        await idle(decode)
        assert not prefill.engine.has_unfinished() and len(prefill.live) == 0

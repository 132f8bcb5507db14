"""Random scheduler traffic against KVCacheManager, checked against a model of block contents.

A small pool, block size 2 and a two-token vocabulary make prefixes collide and evictions frequent.
The model records which token prefix each block's KV was computed for; the index must only ever lead
to blocks whose KV still matches (never to a block that was handed out again).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcache.errors import UnknownRequestError
from kvcache.hashing import hash_token_blocks, model_fingerprint
from kvcache.manager import KVCacheManager, PrefixMatch

BS = 2
NUM_BLOCKS = 8
FP = model_fingerprint(model="stateful", block_size=BS)
TOKENS = st.lists(st.integers(0, 1), max_size=12)


@dataclass
class Request:
    tokens: list[int]
    allocated: int  # tokens the table was asked to cover
    computed: int


class KVCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BS, FP)
        self.requests: dict[str, Request] = {}
        self.content: dict[int, tuple[int, ...]] = {}  # block id -> token prefix its KV was computed for
        self.key_tokens: dict[bytes, tuple[int, ...]] = {}  # block key -> token prefix it names
        self.next_id = 0

    def snapshot(self) -> tuple[object, ...]:
        pool = self.kv.pool
        return (
            [b.block_id for b in pool.free_queue.blocks()],
            [(b.ref_count, b.block_hash) for b in pool.blocks],
            pool.num_evictions,
            {rid: self.kv.block_ids(rid) for rid in self.requests},
        )

    def check_match(self, tokens: list[int], prefix: PrefixMatch) -> None:
        assert prefix.num_tokens == prefix.num_blocks * BS
        assert prefix.num_tokens < len(tokens) or prefix.num_tokens == 0
        for i, (block_id, key) in enumerate(zip(prefix.block_ids, prefix.block_hashes, strict=True)):
            expected = tuple(tokens[: (i + 1) * BS])
            assert self.content[block_id] == expected, "prefix hit leads to KV of other tokens"
            assert self.key_tokens[key] == expected
            assert self.kv.pool.blocks[block_id].block_hash == key
        keys = hash_token_blocks(tokens, BS, FP)
        cap = max(0, (len(tokens) - 1) // BS)
        if prefix.num_blocks < cap:
            assert self.kv.pool.get_cached_block(keys[prefix.num_blocks]) is None, "match not maximal"

    def allocate(self, rid: str, target: int, prefix: PrefixMatch | None) -> list[int] | None:
        needed = self.kv.blocks_needed(rid, target, prefix)
        can = self.kv.can_allocate(rid, target, prefix)
        free_before = self.kv.num_free_blocks
        before = self.snapshot()
        new = self.kv.allocate(rid, target, prefix)
        assert can == (needed <= free_before) == (new is not None)
        if new is None:
            assert self.snapshot() == before, "a refused allocate changed state"
            return None
        assert self.kv.num_free_blocks == free_before - needed
        for block_id in new:
            self.content.pop(block_id, None)  # handed out again: old KV is gone
        assert self.kv.num_tokens_capacity(rid) >= target
        return new

    @rule(tokens=TOKENS, chunk=st.integers(1, 8))
    def add_request(self, tokens: list[int], chunk: int) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        prefix = self.kv.match_prefix(tokens)
        self.check_match(tokens, prefix)
        target = min(len(tokens), prefix.num_tokens + chunk)
        if self.allocate(rid, target, prefix) is not None:
            self.requests[rid] = Request(list(tokens), target, prefix.num_tokens)

    @rule(tokens=TOKENS)
    def match_only(self, tokens: list[int]) -> None:
        self.check_match(tokens, self.kv.match_prefix(tokens))

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 1), max_size=3), chunk=st.integers(1, 6))
    def grow(self, data: st.DataObject, extra: list[int], chunk: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        req = self.requests[rid]
        req.tokens.extend(extra)  # decode appends sampled tokens
        target = min(len(req.tokens), req.allocated + chunk)
        if self.allocate(rid, target, None) is not None:
            req.allocated = max(req.allocated, target)

    def advance(self, rid: str, n: int) -> None:
        """The model computed up to n more tokens of the request; publish its full blocks."""
        req = self.requests[rid]
        req.computed = min(req.allocated, len(req.tokens), req.computed + n)
        self.kv.cache_computed(rid, req.tokens, req.computed)
        block_ids = self.kv.block_ids(rid)
        for i, key in enumerate(self.kv.block_hashes(rid)[: req.computed // BS]):
            expected = tuple(req.tokens[: (i + 1) * BS])
            assert self.content.setdefault(block_ids[i], expected) == expected
            assert self.key_tokens.setdefault(key, expected) == expected, "key names two token prefixes"

    def release(self, rid: str) -> None:
        self.kv.free(rid)
        del self.requests[rid]
        assert not self.kv.has_request(rid)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), n=st.integers(1, 8))
    def compute(self, data: st.DataObject, n: int) -> None:
        self.advance(data.draw(st.sampled_from(sorted(self.requests))), n)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.release(data.draw(st.sampled_from(sorted(self.requests))))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """The common end of a request: all it holds is computed and published, then it is freed."""
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        self.advance(rid, NUM_BLOCKS * BS)
        self.release(rid)

    @rule()
    def free_unknown(self) -> None:
        with pytest.raises(UnknownRequestError):
            self.kv.free("ghost")

    @invariant()
    def integrity(self) -> None:
        self.kv.check_integrity()
        for key, block in self.kv.pool.index.items():
            assert self.content.get(block.block_id) == self.key_tokens[key], "index points at stale KV"
        for rid, req in self.requests.items():
            assert self.kv.num_tokens_capacity(rid) >= req.allocated


KVCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_kv_cache_machine = KVCacheMachine.TestCase

from __future__ import annotations

import pytest

from kvcache.errors import BlockTableError, StalePrefixError, UnknownRequestError
from kvcache.hashing import hash_token_blocks, model_fingerprint
from kvcache.manager import KVCacheManager, PrefixMatch

BS = 4
FP = model_fingerprint(model="test", block_size=BS)


def manager(num_blocks: int = 10, caching: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, FP, enable_prefix_caching=caching)


def run_prefill(kv: KVCacheManager, rid: str, tokens: list[int]) -> PrefixMatch:
    """Match, allocate the whole prompt, compute it, publish it."""
    prefix = kv.match_prefix(tokens)
    assert kv.allocate(rid, len(tokens), prefix) is not None
    kv.cache_computed(rid, tokens, len(tokens))
    kv.check_integrity()
    return prefix


def snapshot(kv: KVCacheManager) -> tuple[object, ...]:
    pool = kv.pool
    return (
        [b.block_id for b in pool.free_queue.blocks()],
        [(b.ref_count, b.block_hash) for b in pool.blocks],
        {h: b.block_id for h, b in pool.index.items()},
        pool.num_evictions,
        {rid: kv.block_ids(rid) for rid in ("a", "b", "c") if kv.has_request(rid)},
    )


def test_prefix_match_after_cache_computed() -> None:
    kv = manager()
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    assert run_prefill(kv, "a", prompt) == PrefixMatch()
    hit = kv.match_prefix([*prompt[:8], 99, 98])
    assert hit.block_ids == tuple(kv.block_ids("a")[:2])
    assert hit.num_tokens == 8
    assert hit.block_hashes == tuple(hash_token_blocks(prompt, BS, FP))
    assert kv.match_prefix([*prompt[:4], 7, 7, 7, 7, 1]).num_tokens == 4  # diverges in block 2
    assert kv.match_prefix([1, *prompt]).num_tokens == 0


def test_match_prefix_is_pure() -> None:
    kv = manager()
    run_prefill(kv, "a", list(range(9)))
    kv.free("a")
    before = snapshot(kv)
    assert kv.match_prefix(list(range(9))).num_blocks == 2
    assert snapshot(kv) == before


def test_match_never_covers_the_whole_sequence() -> None:
    kv = manager()
    prompt = list(range(12))
    run_prefill(kv, "a", [*prompt, 50])  # 3 full blocks cached
    assert kv.match_prefix(prompt).num_tokens == 8  # exact multiple: last block dropped
    assert kv.match_prefix([*prompt, 1]).num_tokens == 12
    assert kv.match_prefix(prompt[:4]).num_tokens == 0
    assert kv.match_prefix([]).num_tokens == 0


def test_partial_blocks_never_enter_the_index() -> None:
    kv = manager()
    kv.allocate("a", 7)
    kv.cache_computed("a", list(range(7)), 7)
    assert len(kv.pool.index) == 1
    assert kv.block_hashes("a") == hash_token_blocks(range(4), BS, FP)
    kv.cache_computed("a", list(range(7)), 3)  # going backwards is harmless
    assert len(kv.pool.index) == 1
    kv.check_integrity()


def test_two_requests_share_a_prefix() -> None:
    kv = manager()
    run_prefill(kv, "a", list(range(9)))
    prefix = run_prefill(kv, "b", [*range(8), 42, 43])
    assert prefix.num_tokens == 8
    shared = kv.block_ids("a")[:2]
    assert kv.block_ids("b")[:2] == shared
    assert [kv.pool.blocks[i].ref_count for i in shared] == [2, 2]
    assert kv.pool.num_used_blocks == 4  # a: 3 blocks, b: 1 own block
    kv.free("a")
    assert [kv.pool.blocks[i].ref_count for i in shared] == [1, 1]
    kv.check_integrity()


def test_allocate_short_returns_none_and_changes_nothing() -> None:
    kv = manager(num_blocks=4)
    run_prefill(kv, "a", list(range(9)))  # 3 blocks, 2 cached
    kv.free("a")
    assert kv.allocate("b", 4) is not None  # block 3; a's blocks stay cached
    before = snapshot(kv)
    prefix = kv.match_prefix([*range(8), 1, 2, 3, 4, 5])  # 2 evictable hits + 2 new blocks > 3 free
    assert prefix.num_blocks == 2
    assert kv.blocks_needed("c", 13, prefix) == 4
    assert not kv.can_allocate("c", 13, prefix)
    assert kv.allocate("c", 13, prefix) is None
    assert kv.allocate("b", 17) is None  # growth short too
    assert snapshot(kv) == before
    assert not kv.has_request("c")
    kv.check_integrity()


def test_blocks_needed_counts_evictable_hits_but_not_held_hits() -> None:
    kv = manager(num_blocks=6)
    run_prefill(kv, "a", list(range(9)))
    prompt = [*range(8), 5]
    prefix = kv.match_prefix(prompt)
    assert kv.blocks_needed("b", 9, prefix) == 1  # hits held by "a": only the new block costs
    kv.free("a")
    assert kv.blocks_needed("b", 9, prefix) == 3  # hits now sit in the free queue
    assert kv.num_free_blocks == 6
    assert kv.allocate("b", 9, prefix) is not None
    assert kv.num_free_blocks == 3
    kv.check_integrity()


def test_hits_are_touched_before_allocating_so_they_are_not_evicted() -> None:
    kv = manager(num_blocks=3)
    run_prefill(kv, "a", list(range(5)))  # blocks 0, 1; block 0 cached
    kv.free("a")  # queue: 2, 1, 0
    assert kv.allocate("c", 8) == [2, 1]  # queue: 0
    kv.free("c")  # queue: 0, 1, 2 - the cached hit is now at the head
    prefix = kv.match_prefix([*range(4), 9])
    assert prefix.block_ids == (0,)
    assert kv.allocate("b", 5, prefix) == [1]  # not 0: the hit left the queue before the pop
    assert kv.block_ids("b") == [0, 1]
    assert kv.pool.num_evictions == 0
    kv.check_integrity()


def test_growth_for_chunked_prefill_and_decode() -> None:
    kv = manager()
    assert kv.allocate("a", 6) == [0, 1]  # first prefill chunk
    assert kv.num_tokens_capacity("a") == 8
    assert kv.allocate("a", 8) == []  # fits
    assert kv.allocate("a", 13) == [2, 3]  # second chunk
    tokens = list(range(13))
    kv.cache_computed("a", tokens, 13)
    for _ in range(3):  # decode: one token at a time
        tokens.append(7)
        assert kv.allocate("a", len(tokens)) == []
    tokens.append(7)
    assert kv.allocate("a", len(tokens)) == [4]
    assert kv.block_ids("a") == [0, 1, 2, 3, 4]
    kv.cache_computed("a", tokens, 16)
    assert kv.block_hashes("a") == hash_token_blocks(tokens, BS, FP)
    assert len(kv.pool.index) == 4
    kv.check_integrity()


def test_free_releases_tail_first() -> None:
    kv = manager(num_blocks=6)
    run_prefill(kv, "a", list(range(17)))  # blocks 0-4, 0-3 cached
    kv.free("a")
    assert [b.block_id for b in kv.pool.free_queue.blocks()] == [5, 4, 3, 2, 1, 0]
    assert kv.allocate("b", 8) == [5, 4]  # 4 was uncached (partial); nothing evicted yet
    assert kv.pool.num_evictions == 0
    assert kv.allocate("b", 12) == [3]
    assert kv.pool.num_evictions == 1
    assert kv.match_prefix(list(range(17))).num_tokens == 12
    kv.check_integrity()


def test_duplicate_content_stays_unindexed() -> None:
    kv = manager()
    kv.allocate("a", 5)
    kv.allocate("b", 5)  # same prompt scheduled in the same step: no hit for b
    kv.cache_computed("a", list(range(5)), 5)
    kv.cache_computed("b", list(range(5)), 5)
    first_a, first_b = kv.block_ids("a")[0], kv.block_ids("b")[0]
    assert kv.match_prefix(list(range(5))).block_ids == (first_a,)
    assert kv.pool.blocks[first_b].block_hash is None
    kv.free("b")
    assert kv.pool.num_cached_blocks == 0
    kv.check_integrity()


def test_stale_prefix_raises() -> None:
    kv = manager(num_blocks=3)
    run_prefill(kv, "a", list(range(5)))
    kv.free("a")
    prefix = kv.match_prefix(list(range(5)))
    assert prefix.num_blocks == 1
    kv.allocate("b", 12)  # evicts the hit
    with pytest.raises(StalePrefixError):
        kv.allocate("c", 5, prefix)
    kv.check_integrity()


def test_misuse_raises() -> None:
    kv = manager()
    with pytest.raises(UnknownRequestError):
        kv.free("nope")
    with pytest.raises(UnknownRequestError):
        kv.cache_computed("nope", [1], 1)
    with pytest.raises(UnknownRequestError):
        kv.block_ids("nope")
    run_prefill(kv, "a", list(range(9)))
    prefix = kv.match_prefix(list(range(9)))
    with pytest.raises(BlockTableError):
        kv.allocate("a", 12, prefix)  # prefix only on the first call
    with pytest.raises(BlockTableError):
        kv.allocate("b", 4, prefix)  # fewer tokens than the prefix covers
    with pytest.raises(BlockTableError):
        kv.cache_computed("a", list(range(9)), 10)
    with pytest.raises(BlockTableError):
        kv.cache_computed("a", list(range(20)), 20)  # past capacity
    kv.free("a")
    with pytest.raises(UnknownRequestError):
        kv.free("a")
    kv.check_integrity()


def test_usage_and_caching_disabled() -> None:
    kv = manager(num_blocks=4, caching=False)
    run_prefill(kv, "a", list(range(9)))
    assert kv.usage == 0.75
    assert kv.match_prefix(list(range(9))) == PrefixMatch()
    kv.free("a")
    assert kv.usage == 0.0 and len(kv.pool.index) == 0
    kv.check_integrity()


def test_a_block_computed_again_keeps_the_cached_one_and_refreshes_it() -> None:
    """A request that computes blocks the index already holds (a hybrid model's, past its state checkpoints) leaves
    the cached ones indexed and moves them to the free queue's tail, leading block last: they are in use again."""
    kv = manager(num_blocks=12)
    shared, other = list(range(8)), list(range(100, 108))
    run_prefill(kv, "a", shared)
    kv.free("a")
    run_prefill(kv, "b", other)
    kv.free("b")
    originals = [b.block_id for b in kv.pool.free_queue.blocks() if b.block_hash is not None][-4:-2]
    assert originals == list(kv.match_prefix([*shared, 0]).block_ids[::-1])  # "a"'s, older than "b"'s
    assert kv.allocate("c", len(shared), PrefixMatch()) is not None  # no hit used: computed again
    kv.cache_computed("c", shared, len(shared))
    kv.check_integrity()
    assert kv.match_prefix([*shared, 0]).block_ids == tuple(reversed(originals))  # still "a"'s blocks
    cached_order = [b.block_id for b in kv.pool.free_queue.blocks() if b.block_hash is not None]
    assert cached_order[-2:] == originals  # now the last evicted: the deepest, then the leading one
    kv.free("c")
    kv.check_integrity()

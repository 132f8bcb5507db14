"""Pin the exact allocation/eviction order of BlockPool (vLLM v1 style)."""

from __future__ import annotations

import pytest

from kvcache.block import KVBlock
from kvcache.block_pool import BlockPool
from kvcache.errors import BlockStateError, DoubleFreeError


def key(name: str) -> bytes:
    return name.encode().ljust(16, b".")


def queue_ids(pool: BlockPool) -> list[int]:
    return [block.block_id for block in pool.free_queue.blocks()]


def ids(blocks: list[KVBlock] | None) -> list[int]:
    assert blocks is not None
    return [block.block_id for block in blocks]


def allocate_cached(pool: BlockPool, n: int, name: str) -> list[KVBlock]:
    """Allocate n blocks and publish them as computed under keys name0, name1, ..."""
    blocks = pool.allocate(n)
    assert blocks is not None
    for i, block in enumerate(blocks):
        assert pool.cache_block(block, key(f"{name}{i}"))
    return blocks


def test_fresh_pool() -> None:
    pool = BlockPool(10)
    assert queue_ids(pool) == list(range(10))
    assert (pool.num_free_blocks, pool.num_cached_blocks, pool.num_used_blocks) == (10, 0, 0)
    pool.check_integrity()


def test_allocate_pops_from_head_in_id_order() -> None:
    pool = BlockPool(10)
    assert ids(pool.allocate(3)) == [0, 1, 2]
    assert ids(pool.allocate(2)) == [3, 4]
    assert all(pool.blocks[i].ref_count == 1 for i in range(5))
    assert pool.num_used_blocks == 5
    pool.check_integrity()


def test_allocate_short_returns_none_and_changes_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    before = queue_ids(pool)
    assert pool.allocate(2) is None
    assert queue_ids(pool) == before
    assert ids(pool.allocate(0)) == []
    pool.check_integrity()


def test_free_appends_tail_first_and_eviction_order_is_pinned() -> None:
    pool = BlockPool(10)
    a = allocate_cached(pool, 4, "a")  # blocks 0-3, keys a0..a3
    b = pool.allocate(2)  # blocks 4-5, never cached
    assert b is not None
    pool.free(a)
    assert queue_ids(pool) == [6, 7, 8, 9, 3, 2, 1, 0]  # deepest block of A nearest the head
    pool.free(b)
    assert queue_ids(pool) == [6, 7, 8, 9, 3, 2, 1, 0, 5, 4]
    assert pool.num_cached_blocks == 4
    assert pool.get_cached_block(key("a3")) is pool.blocks[3]  # cached blocks stay findable
    pool.check_integrity()

    assert ids(pool.allocate(5)) == [6, 7, 8, 9, 3]  # never-used first, then A's deepest block
    assert pool.get_cached_block(key("a3")) is None
    assert pool.blocks[3].block_hash is None
    assert [pool.get_cached_block(key(f"a{i}")) is not None for i in range(3)] == [True, True, True]
    assert (pool.num_evictions, pool.num_cached_blocks) == (1, 3)

    assert ids(pool.allocate(2)) == [2, 1]
    assert pool.get_cached_block(key("a2")) is None and pool.get_cached_block(key("a1")) is None
    assert pool.get_cached_block(key("a0")) is pool.blocks[0]  # the shared root block survives longest
    assert queue_ids(pool) == [0, 5, 4]
    assert pool.num_evictions == 3
    pool.check_integrity()


def test_lru_among_freed_requests_older_freed_is_evicted_first() -> None:
    pool = BlockPool(6)
    a = allocate_cached(pool, 3, "a")  # 0-2
    c = allocate_cached(pool, 3, "c")  # 3-5
    pool.free(a)
    pool.free(c)
    assert queue_ids(pool) == [2, 1, 0, 5, 4, 3]
    assert ids(pool.allocate(3)) == [2, 1, 0]
    assert all(pool.get_cached_block(key(f"a{i}")) is None for i in range(3))
    assert all(pool.get_cached_block(key(f"c{i}")) is not None for i in range(3))
    pool.check_integrity()


def test_prefix_hit_revives_cached_block_out_of_the_free_queue() -> None:
    pool = BlockPool(6)
    a = allocate_cached(pool, 3, "a")  # 0-2
    pool.free(a)
    assert queue_ids(pool) == [3, 4, 5, 2, 1, 0]
    hit = pool.get_cached_block(key("a0"))
    assert hit is pool.blocks[0]
    pool.touch([hit])
    assert hit.ref_count == 1 and not hit.in_free_queue
    assert queue_ids(pool) == [3, 4, 5, 2, 1]
    assert (pool.num_free_blocks, pool.num_cached_blocks) == (5, 2)
    assert ids(pool.allocate(5)) == [3, 4, 5, 2, 1]  # the revived block is never handed out
    assert pool.allocate(1) is None
    assert pool.get_cached_block(key("a0")) is hit  # held blocks stay indexed
    pool.check_integrity(owners={"r": [0, 3, 4, 5, 2, 1]})


def test_touch_shared_block_and_free_twice() -> None:
    pool = BlockPool(4)
    (shared,) = allocate_cached(pool, 1, "s")
    pool.touch([shared])
    assert shared.ref_count == 2
    pool.check_integrity(owners={"x": [0], "y": [0]})
    pool.free([shared])
    assert shared.ref_count == 1 and not shared.in_free_queue
    pool.free([shared])
    assert shared.ref_count == 0 and queue_ids(pool) == [1, 2, 3, 0]
    with pytest.raises(DoubleFreeError):
        pool.free([shared])
    pool.check_integrity()


def test_double_free_in_one_call_changes_nothing() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    assert blocks is not None
    with pytest.raises(DoubleFreeError):
        pool.free([blocks[0], blocks[1], blocks[0]])
    assert [b.ref_count for b in blocks] == [1, 1]
    pool.check_integrity()


def test_cache_block_duplicate_content_keeps_existing_entry() -> None:
    pool = BlockPool(4)
    first, second = pool.allocate(2) or []
    assert pool.cache_block(first, key("k"))
    assert not pool.cache_block(second, key("k"))
    assert second.block_hash is None
    assert pool.get_cached_block(key("k")) is first
    assert pool.cache_block(first, key("k"))  # idempotent
    with pytest.raises(BlockStateError):
        pool.cache_block(first, key("other"))
    pool.free([first, second])
    assert pool.num_cached_blocks == 1  # the duplicate is plain free
    pool.check_integrity()


def test_cache_or_touch_of_free_block_raises() -> None:
    pool = BlockPool(2)
    with pytest.raises(BlockStateError):
        pool.cache_block(pool.blocks[0], key("k"))
    with pytest.raises(BlockStateError):
        pool.touch([pool.blocks[0]])
    pool.check_integrity()


def test_caching_disabled() -> None:
    pool = BlockPool(2, enable_caching=False)
    (block,) = pool.allocate(1) or []
    assert not pool.cache_block(block, key("k"))
    assert pool.get_cached_block(key("k")) is None
    pool.free([block])
    assert pool.num_cached_blocks == 0
    pool.check_integrity()


def test_evict_cached_and_reset_prefix_cache() -> None:
    pool = BlockPool(8)
    a = allocate_cached(pool, 3, "a")  # 0-2
    held = allocate_cached(pool, 1, "h")  # 3, stays in use
    pool.free(a)
    assert pool.evict_cached(1) == 1  # head-most cached: a2
    assert pool.get_cached_block(key("a2")) is None
    assert queue_ids(pool) == [4, 5, 6, 7, 2, 1, 0]  # evicted blocks stay free, in place
    assert pool.reset_prefix_cache() == 2
    assert pool.num_cached_blocks == 0 and pool.num_evictions == 3
    assert pool.get_cached_block(key("h0")) is held[0]  # in-use blocks keep their key
    pool.check_integrity(owners={"held": [3]})


def test_check_integrity_detects_owner_mismatch() -> None:
    pool = BlockPool(4)
    pool.allocate(2)
    pool.check_integrity(owners={"r": [0, 1]})
    with pytest.raises(AssertionError):
        pool.check_integrity(owners={"r": [0]})
    with pytest.raises(AssertionError):
        pool.check_integrity(owners={"r": [0, 1, 1]})
    with pytest.raises(AssertionError):
        pool.check_integrity(owners={"r": [0, 1], "s": [1]})

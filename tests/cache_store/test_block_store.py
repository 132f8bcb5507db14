"""BlockStore, memory only: capacity, pinned LRU order, checksum rejection, longest-prefix lookup, atomic
puts, key checks and counters."""

from __future__ import annotations

import pytest

from services.cache_store import errors
from services.cache_store.block import StoredBlock, checksum
from services.cache_store.store import BlockStore
from tests.cache_store.helpers import FP, OTHER_FP, block, blocks, key, keys, names


def memory_order(store: BlockStore) -> list[str]:
    return names(store.memory.keys_lru_first())


def test_put_then_get_roundtrip_both_algorithms():
    store = BlockStore(100)
    result = store.put([block("a"), block("b", algorithm="blake2b-128")])
    assert (result.stored, result.existing, result.evicted) == (2, 0, 0)
    got = store.get_prefix(keys("a", "b"))
    assert [b.data for b in got] == [block("a").data, block("b").data]
    assert got[0].layout == block("a").layout
    assert store.used_bytes == 20
    store.check_integrity()


def test_lookup_is_longest_stored_prefix():
    store = BlockStore(100)
    store.put(blocks("a", "b", "d"))
    assert store.lookup(keys("a", "b", "c", "d")) == 2
    assert store.lookup(keys("x", "a")) == 0
    assert store.lookup(keys("a", "b", "d")) == 3
    assert store.lookup([]) == 0


def test_lookup_does_not_refresh_recency():
    store = BlockStore(100)
    store.put([block("a")])
    store.put([block("b")])
    store.lookup(keys("a"))
    assert memory_order(store) == ["a", "b"]


def test_eviction_order_is_pinned():
    # Within one put the first key is the most recent: a chain a→b→c loses c first, then b, then a.
    store = BlockStore(50)
    store.put(blocks("a", "b", "c"))
    assert memory_order(store) == ["c", "b", "a"]
    store.put([block("d")])
    store.put([block("e")])
    assert memory_order(store) == ["c", "b", "a", "d", "e"]
    result = store.put([block("f")])  # full: evicts c
    assert result.evicted == 1
    assert memory_order(store) == ["b", "a", "d", "e", "f"]
    store.get_prefix(keys("b"))  # refresh b
    store.put([block("g", size=20)])  # evicts a, d
    assert memory_order(store) == ["e", "f", "b", "g"]
    assert store.memory.evictions_total == 3
    assert store.used_bytes == 50
    store.check_integrity()


def test_existing_key_is_refreshed_not_replaced():
    store = BlockStore(30)
    store.put(blocks("a", "b", "c"))
    result = store.put(blocks("c", "x"))  # c exists; x needs room: evicts b (LRU after c moved)
    assert (result.stored, result.existing, result.evicted) == (1, 1, 1)
    assert memory_order(store) == ["a", "x", "c"]


def test_put_never_evicts_its_own_keys():
    store = BlockStore(20)
    store.put([block("a")])
    store.put([block("b")])
    store.put(blocks("a", "c"))  # room for c: evicts b, keeps a although a was LRU
    assert memory_order(store) == ["c", "a"]


def test_corrupt_block_rejects_whole_put_and_changes_nothing():
    store = BlockStore(100)
    store.put([block("a")])
    before = (store.memory.keys_lru_first(), store.used_bytes)
    bad = StoredBlock(key("bad"), b"0123456789", "crc32", checksum("crc32", b"0123456780"))
    with pytest.raises(errors.CorruptBlockError, match="checksum mismatch"):
        store.put([block("b"), bad])
    assert (store.memory.keys_lru_first(), store.used_bytes) == before
    assert key("b") not in store


def test_unknown_checksum_algorithm_is_malformed():
    with pytest.raises(errors.MalformedPutError, match="checksum_algorithm"):
        BlockStore(100).put([StoredBlock(key("k"), b"data", "md5", b"x")])


def test_put_larger_than_capacity_is_refused_and_changes_nothing():
    store = BlockStore(25)
    store.put([block("a")])
    with pytest.raises(errors.StoreFullError, match="do not fit in the memory tier"):
        store.put([block("b", size=26)])
    with pytest.raises(errors.StoreFullError, match="10 of them held by blocks this put refreshes"):
        store.put([block("a"), block("c", size=20)])  # a is kept by the put: 10 + 20 > 25
    assert memory_order(store) == ["a"]
    store.check_integrity()


def test_get_missing_key_raises_unless_partial():
    store = BlockStore(100)
    store.put(blocks("a", "b"))
    with pytest.raises(errors.MissingBlockError, match=r"keys\[2\]"):
        store.get_prefix(keys("a", "b", "c"))
    assert store.hits_total == 0
    assert [b.key for b in store.get_prefix(keys("a", "b", "c"), allow_partial=True)] == keys("a", "b")
    assert store.hits_total == 2


def test_misses_count_every_unserved_get_key_and_one_per_lookup():
    store = BlockStore(100)
    store.put(blocks("a", "b"))
    store.get_prefix(keys("a", "x", "b", "y"), allow_partial=True)  # serves a: 3 misses
    assert (store.hits_total, store.misses_total) == (1, 3)
    with pytest.raises(errors.MissingBlockError):
        store.get_prefix(keys("z", "a"))  # 2 misses
    assert store.misses_total == 5
    assert store.lookup(keys("a", "x", "y")) == 1  # 1 miss per lookup
    assert store.lookup(keys("a", "b")) == 2
    assert (store.hits_total, store.misses_total) == (1, 6)


@pytest.mark.parametrize("call", ["lookup", "get"])
def test_get_and_lookup_check_key_length_and_fingerprint(call):
    store = BlockStore(100)
    store.put(blocks("a"))

    def run(request_keys: list[bytes], fingerprint: bytes = b"") -> None:
        if call == "lookup":
            store.lookup(request_keys, fingerprint)
        else:
            store.open_get(request_keys, allow_partial=True, fingerprint=fingerprint).close()

    with pytest.raises(errors.InvalidKeyError, match=r"^keys\[1\]: must be 32 bytes"):
        run([key("a"), b"short"])
    with pytest.raises(errors.InvalidKeyError, match=r"^keys\[1\]: key for another model"):
        run([key("a"), key("a", OTHER_FP)], FP)
    with pytest.raises(errors.InvalidKeyError, match=r"^model_fingerprint: must be 16 bytes"):
        run([key("a")], b"abc")
    run([key("a"), key("a", OTHER_FP)])  # no fingerprint given: any model's keys may be asked for
    run(keys("a"), FP)
    assert store.misses_total == 1


def test_a_restore_get_counts_restored_blocks_not_prefix_hits_or_misses():
    """A decode node reading back a preempted request's copy is not prefix reuse: its blocks count in
    ``restored_blocks_total`` only, and keys it misses (the copy was evicted) are not prefix misses."""
    store = BlockStore(100)
    store.put(blocks("a", "b"))
    assert [b.key for b in store.get_prefix(keys("a", "b"), restore=True)] == keys("a", "b")
    with store.open_get(keys("a", "x"), allow_partial=True, restore=True) as reader:
        assert [b.key for b in reader] == keys("a")
    assert (store.restored_blocks_total, store.hits_total, store.misses_total) == (3, 0, 0)
    store.get_prefix(keys("b"))
    assert (store.restored_blocks_total, store.hits_total, store.stats().restored_blocks_total) == (3, 1, 3)

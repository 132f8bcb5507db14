"""BlockStore: capacity, pinned LRU order, checksum rejection, longest-prefix lookup, atomic puts."""

from __future__ import annotations

import pytest

from services.cache_store import errors
from services.cache_store.store import BlockStore, StoredBlock, checksum


def block(name: str, size: int = 10, algorithm: str = "crc32") -> StoredBlock:
    data = (name.encode() * size)[:size]
    return StoredBlock(name.encode(), data, algorithm, checksum(algorithm, data))


def keys(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


def test_put_then_get_roundtrip_both_algorithms():
    store = BlockStore(100)
    result = store.put([block("a"), block("b", algorithm="blake2b-128")])
    assert (result.stored, result.existing, result.evicted) == (2, 0, 0)
    got = store.get_prefix(keys("a", "b"))
    assert [b.data for b in got] == [block("a").data, block("b").data]
    assert store.used_bytes == 20
    store.check_integrity()


def test_lookup_is_longest_stored_prefix():
    store = BlockStore(100)
    store.put([block("a"), block("b"), block("d")])
    assert store.lookup(keys("a", "b", "c", "d")) == 2
    assert store.lookup(keys("x", "a")) == 0
    assert store.lookup(keys("a", "b", "d")) == 3
    assert store.lookup([]) == 0


def test_lookup_does_not_refresh_recency():
    store = BlockStore(100)
    store.put([block("a")])
    store.put([block("b")])
    store.lookup(keys("a"))
    assert store.keys_lru_first() == [b"a", b"b"]


def test_eviction_order_is_pinned():
    # Within one put the first key is the most recent: a chain a→b→c loses c first, then b, then a.
    store = BlockStore(50)
    store.put([block("a"), block("b"), block("c")])
    assert store.keys_lru_first() == keys("c", "b", "a")
    store.put([block("d")])
    store.put([block("e")])
    assert store.keys_lru_first() == keys("c", "b", "a", "d", "e")
    result = store.put([block("f")])  # full: evicts c
    assert result.evicted == 1
    assert store.keys_lru_first() == keys("b", "a", "d", "e", "f")
    store.get_prefix(keys("b"))  # refresh b
    store.put([block("g", size=20)])  # evicts a, d
    assert store.keys_lru_first() == keys("e", "f", "b", "g")
    assert store.evictions_total == 3
    store.check_integrity()


def test_existing_key_is_refreshed_not_replaced():
    store = BlockStore(30)
    store.put([block("a"), block("b"), block("c")])
    result = store.put([block("c"), block("x")])  # c exists; x needs room: evicts b (LRU after c moved)
    assert (result.stored, result.existing, result.evicted) == (1, 1, 1)
    assert store.keys_lru_first() == keys("a", "x", "c")


def test_put_never_evicts_its_own_keys():
    store = BlockStore(20)
    store.put([block("a")])
    store.put([block("b")])
    store.put([block("a"), block("c")])  # room for c: evicts b, keeps a although a was LRU
    assert store.keys_lru_first() == keys("c", "a")


def test_corrupt_block_rejects_whole_put_and_changes_nothing():
    store = BlockStore(100)
    store.put([block("a")])
    before = (store.keys_lru_first(), store.used_bytes)
    bad = StoredBlock(b"bad", b"0123456789", "crc32", checksum("crc32", b"0123456780"))
    with pytest.raises(errors.CorruptBlockError, match="checksum mismatch"):
        store.put([block("b"), bad])
    assert (store.keys_lru_first(), store.used_bytes) == before
    assert b"b" not in store


def test_unknown_checksum_algorithm_is_malformed():
    with pytest.raises(errors.MalformedPutError, match="checksum_algorithm"):
        BlockStore(100).put([StoredBlock(b"k", b"data", "md5", b"x")])


def test_put_larger_than_capacity_is_refused_and_changes_nothing():
    store = BlockStore(25)
    store.put([block("a")])
    with pytest.raises(errors.StoreFullError, match="do not fit"):
        store.put([block("b", size=26)])
    with pytest.raises(errors.StoreFullError):
        store.put([block("a"), block("c", size=20)])  # a is pinned by the put: 10 + 20 > 25
    assert store.keys_lru_first() == [b"a"]
    store.check_integrity()


def test_get_missing_key_raises_unless_partial():
    store = BlockStore(100)
    store.put([block("a"), block("b")])
    with pytest.raises(errors.MissingBlockError, match=r"keys\[2\]"):
        store.get_prefix(keys("a", "b", "c"))
    assert store.hit_blocks_total == 0
    assert [b.key for b in store.get_prefix(keys("a", "b", "c"), allow_partial=True)] == keys("a", "b")
    assert store.hit_blocks_total == 2

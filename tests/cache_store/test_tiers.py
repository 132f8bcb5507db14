"""Memory and disk tiers together, on real files: exact eviction order and capacity per tier, promotion,
write-through, damaged files, and re-opening a directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog

from services.cache_store import block_file, errors
from services.cache_store.block import StoredBlock, checksum
from services.cache_store.disk_tier import DiskTier
from services.cache_store.store import BlockStore
from tests.cache_store.helpers import LAYOUT_BYTES, block, blocks, key, keys, names


def open_store(directory: Path, memory: int = 30, disk: int = 40, write_through: bool = False) -> BlockStore:
    return BlockStore(memory, DiskTier(directory, disk), write_through=write_through)


def tiers(store: BlockStore) -> tuple[list[str], list[str]]:
    """(memory, disk) keys, least recently used first."""
    assert store.disk is not None
    return names(store.memory.keys_lru_first()), names(store.disk.keys_lru_first())


def files(directory: Path) -> set[str]:
    return {path.name for path in directory.iterdir()}


def test_memory_evicts_into_disk_and_disk_evicts_its_lru(tmp_path):
    store = open_store(tmp_path)  # 3 blocks in memory, 4 on disk
    store.put(blocks("a", "b", "c"))
    assert tiers(store) == (["c", "b", "a"], [])
    store.put([block("d")])
    assert tiers(store) == (["b", "a", "d"], ["c"])
    store.put([block("e")])
    store.put([block("f")])
    assert tiers(store) == (["d", "e", "f"], ["c", "b", "a"])
    store.put([block("g")])
    assert tiers(store) == (["e", "f", "g"], ["c", "b", "a", "d"])
    result = store.put([block("h")])  # memory evicts e; disk is full: drops c
    assert (result.stored, result.evicted) == (1, 1)
    assert tiers(store) == (["f", "g", "h"], ["b", "a", "d", "e"])
    assert files(tmp_path) == {k.hex() for k in keys("b", "a", "d", "e")}
    stats = store.stats()
    assert (stats.memory_bytes_used, stats.disk_bytes_used, stats.blocks) == (30, 40, 7)
    assert (stats.memory_evictions_total, stats.disk_evictions_total) == (5, 1)
    assert store.lookup(keys("a", "b", "c")) == 2
    store.check_integrity()


def test_disk_hit_is_verified_refreshed_and_promoted(tmp_path):
    store = open_store(tmp_path)
    for name in "abcdefgh":
        store.put([block(name)])
    assert tiers(store) == (["f", "g", "h"], ["b", "c", "d", "e"])
    got = store.get_prefix(keys("c", "g"))
    assert [b.data for b in got] == [block("c").data, block("g").data]
    assert got[0].layout == block("c").layout
    # c is read from disk (touched there), promoted: memory evicts f, which goes to disk, evicting b
    assert tiers(store) == (["h", "g", "c"], ["d", "e", "c", "f"])
    stats = store.stats()
    assert (stats.hits_total, stats.disk_hits_total, stats.misses_total) == (2, 1, 0)
    assert (stats.memory_blocks, stats.disk_blocks, stats.blocks) == (3, 4, 6)
    store.check_integrity()


def test_put_of_a_disk_only_key_is_existing_and_refreshes_it_on_disk(tmp_path):
    store = open_store(tmp_path)
    for name in "abcdef":
        store.put([block(name)])
    assert tiers(store) == (["d", "e", "f"], ["a", "b", "c"])
    result = store.put([block("a")])
    assert (result.stored, result.existing) == (0, 1)
    assert tiers(store) == (["d", "e", "f"], ["b", "c", "a"])


def test_reopen_serves_what_reached_disk_in_the_same_order(tmp_path):
    store = open_store(tmp_path)
    for name in "abcdefg":
        store.put([block(name)])
    store.get_prefix(keys("b"))  # read from disk, promoted: memory evicts e to disk, which drops a
    assert tiers(store) == (["f", "g", "b"], ["c", "d", "b", "e"])
    del store

    reopened = open_store(tmp_path)
    assert tiers(reopened) == ([], ["c", "d", "b", "e"])
    assert reopened.lookup(keys("c", "d", "b", "e")) == 4
    assert reopened.lookup(keys("f")) == 0  # f and g were only in memory
    assert [b.data for b in reopened.get_prefix(keys("d", "c"))] == [block("d").data, block("c").data]
    assert reopened.stats().disk_hits_total == 2
    reopened.check_integrity()


def test_reopen_cleans_the_directory_and_applies_the_capacity(tmp_path):
    store = open_store(tmp_path, memory=100, disk=100, write_through=True)
    store.put(blocks("a", "b", "c", "d"))  # on disk: d, c, b, a from least to most recent
    (tmp_path / f"{key('x').hex()}.123.0.tmp").write_bytes(b"half a block")
    (tmp_path / key("short").hex()).write_bytes(b"PDKV")
    truncated = (tmp_path / key("a").hex()).read_bytes()[:-1]
    (tmp_path / key("cut").hex()).write_bytes(truncated)
    (tmp_path / "README").write_text("not a block")
    del store

    reopened = open_store(tmp_path, disk=25)  # room for 2 of the 4 blocks: the most recent ones stay
    assert tiers(reopened) == ([], ["b", "a"])
    assert files(tmp_path) == {key("a").hex(), key("b").hex(), "README"}
    assert reopened.stats().disk_evictions_total == 2


def test_write_through_puts_every_block_on_disk_before_answering(tmp_path):
    store = open_store(tmp_path, write_through=True)
    store.put(blocks("a", "b"))
    assert tiers(store) == (["b", "a"], ["b", "a"])
    assert files(tmp_path) == {k.hex() for k in keys("a", "b")}
    store.put(blocks("c", "d"))  # memory evicts b (already on disk: no second write)
    assert tiers(store) == (["a", "d", "c"], ["b", "a", "d", "c"])
    store.check_integrity()


def test_write_through_put_that_disk_cannot_hold_changes_nothing(tmp_path):
    store = open_store(tmp_path, memory=100, disk=40, write_through=True)
    store.put(blocks("a", "b"))
    before = tiers(store), files(tmp_path)
    with pytest.raises(errors.StoreFullError, match="do not fit in the disk tier"):
        store.put(blocks("c", "d", "e", "f", "g"))
    assert (tiers(store), files(tmp_path)) == before


def test_failed_disk_write_leaves_no_file_and_changes_nothing(tmp_path, monkeypatch):
    store = open_store(tmp_path, memory=100, disk=100, write_through=True)
    store.put(blocks("a"))
    real_write = block_file.write_block

    def failing_write(directory: Path, stored) -> int:
        if stored.key == key("c"):
            raise OSError(28, "No space left on device")
        return real_write(directory, stored)

    monkeypatch.setattr(block_file, "write_block", failing_write)
    with pytest.raises(errors.DiskWriteError, match="No space left"):
        store.put(blocks("b", "c"))
    assert tiers(store) == (["a"], ["a"])
    assert files(tmp_path) == {key("a").hex()}
    store.check_integrity()


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "delete", "swap"])
def test_damaged_disk_block_is_missing_and_its_file_removed(tmp_path, damage):
    store = open_store(tmp_path, disk=60, write_through=True)
    store.put(blocks("a", "b", "c"))
    for name in "def":  # a, b, c are now on disk only
        store.put([block(name)])
    assert tiers(store) == (["d", "e", "f"], ["c", "b", "a", "d", "e", "f"])
    path = tmp_path / key("b").hex()
    raw = path.read_bytes()
    if damage == "flip a byte":
        path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "truncate":
        path.write_bytes(raw[:-3])
    elif damage == "delete":
        path.unlink()
    else:
        path.write_bytes((tmp_path / key("c").hex()).read_bytes())  # another block's (valid) file

    partial = store.get_prefix(keys("a", "b", "c"), allow_partial=True)
    assert [b.key for b in partial] == keys("a")
    assert not path.exists() and key("b") not in store
    assert store.lookup(keys("a", "b")) == 1
    stats = store.stats()
    assert (stats.disk_corrupt_total, stats.disk_evictions_total, stats.disk_blocks) == (1, 1, 5)
    assert stats.misses_total == 2 + 1  # b and c unserved by the get, then the lookup's miss
    store.check_integrity()


@pytest.mark.parametrize("damage", ["truncate", "delete", "swap"])
def test_a_put_replaces_a_damaged_disk_only_copy_instead_of_keeping_it(tmp_path, damage):
    """A prefill node that recomputed a block it could not fetch writes it back: the store used to count
    the damaged file as the block and keep it, so the next fetch failed again."""
    store = open_store(tmp_path)
    for name in "abcdef":
        store.put([block(name)])
    assert tiers(store) == (["d", "e", "f"], ["a", "b", "c"])
    path = tmp_path / key("b").hex()
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-3])
    elif damage == "delete":
        path.unlink()
    else:
        path.write_bytes((tmp_path / key("c").hex()).read_bytes())
    recomputed_a = StoredBlock(key("a"), b"other bits", "crc32", checksum("crc32", b"other bits"), LAYOUT_BYTES)
    result = store.put([recomputed_a, block("b")])  # a's file is whole: existing, other bits or not
    assert (result.stored, result.existing) == (1, 1)  # b's is stored anew
    assert store.stats().disk_corrupt_total == 1
    assert [got.data for got in store.get_prefix(keys("b"))] == [block("b").data]
    store.check_integrity()


def test_spills_that_fail_are_counted_and_logged_once_per_run(tmp_path, monkeypatch):
    store = open_store(tmp_path, memory=20)  # 2 blocks in memory
    real_write = block_file.write_block
    failing = True

    def write(directory: Path, stored) -> int:
        if failing:
            raise OSError(28, "No space left on device")
        return real_write(directory, stored)

    monkeypatch.setattr(block_file, "write_block", write)
    with structlog.testing.capture_logs() as logs:
        for name in "abcde":  # c, d, e each evict one block, whose spill fails: dropped
            store.put([block(name)])
        assert tiers(store) == (["d", "e"], [])
        failing = False
        store.put([block("f")])  # evicts d: written
        store.put([block("g")])
    assert tiers(store) == (["f", "g"], ["d", "e"])
    assert store.stats().disk_write_failures_total == 3
    assert [entry["log_level"] for entry in logs] == ["warning", "info"]
    assert "No space left" in logs[0]["error"] and logs[1]["failures_total"] == 3
    store.check_integrity()


def test_damaged_disk_block_fails_a_whole_get_with_missing(tmp_path):
    store = open_store(tmp_path, disk=60, write_through=True)
    store.put(blocks("a", "b", "c"))
    for name in "def":
        store.put([block(name)])
    os.truncate(tmp_path / key("b").hex(), 5)
    with store.open_get(keys("d", "a", "b")) as reader, pytest.raises(errors.MissingBlockError, match=r"keys\[2\]"):
        for _ in reader:
            pass
    assert reader.served == keys("d", "a")


def test_disk_only_block_is_served_unpromoted_when_memory_is_held_by_leases(tmp_path):
    store = open_store(tmp_path, memory=20, disk=40, write_through=True)
    store.put(blocks("a"))
    store.put(blocks("b", "c"))  # a is on disk only now
    with store.open_get(keys("b", "c")) as holding:
        with store.open_get(keys("a")) as reader:
            assert [b.key for b in reader] == keys("a")
        assert names(store.memory.keys_lru_first()) == ["c", "b"]
        list(holding)
    store.check_integrity()


def test_write_through_stages_files_as_blocks_arrive_and_a_failed_put_leaves_none(tmp_path):
    store = open_store(tmp_path, memory=100, disk=100, write_through=True)
    staging = store.staging()
    for stored in blocks("a", "b"):
        staging.add(stored)
    assert len(list(tmp_path.glob("*.tmp"))) == 2 and key("a") not in store
    store.put(blocks("a", "b"), verified=True, staging=staging)
    staging.discard()
    assert files(tmp_path) == {k.hex() for k in keys("a", "b")}
    assert tiers(store) == (["b", "a"], ["b", "a"])

    failed = store.staging()
    for stored in blocks("a", "c"):  # a is on disk already: not staged again
        failed.add(stored)
    assert list(failed.files) == [key("c")]
    failed.discard()  # the stream broke before the put
    assert files(tmp_path) == {k.hex() for k in keys("a", "b")}
    store.check_integrity()


def test_delete_removes_a_block_from_both_tiers_and_spares_one_being_read(tmp_path):
    store = open_store(tmp_path, write_through=True)
    store.put(blocks("a", "b", "c"))  # in memory and, written through, on disk
    evictions = store.stats().memory_evictions_total
    reading = store.open_get(keys("c"))  # a Get streaming "c" leases it
    assert store.delete(keys("a", "c", "absent")) == 1
    memory, disk = tiers(store)
    assert sorted(memory) == sorted(disk) == ["b", "c"] and block_file.file_name(key("a")) not in files(tmp_path)
    assert store.stats().memory_evictions_total == evictions and store.deleted_total == 1  # not evictions
    reading.close()
    store.check_integrity()

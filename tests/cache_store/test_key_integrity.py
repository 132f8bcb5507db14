"""A key, once stored, never changes bytes (BlockStore, in-process, on real files): first writer wins,
only a block's writer deletes it, and a block whose bytes changed since its Put is never served."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cache_store import block_file, errors
from services.cache_store.block import StoredBlock, checksum, digest_of
from services.cache_store.disk_tier import DiskTier
from services.cache_store.store import BlockStore
from tests.cache_store.helpers import LAYOUT_BYTES, block, key, keys

A, B = "cn:prefill-1", "cn:decode-1"


def other_bytes(name: str, data: bytes = b"other bits") -> StoredBlock:
    """``name``'s key with bytes that differ from :func:`block`'s (KV recomputed elsewhere)."""
    return StoredBlock(key(name), data, "crc32", checksum("crc32", data), LAYOUT_BYTES)


def served(store: BlockStore, *names: str) -> list[bytes]:
    return [bytes(b.data) for b in store.get_prefix(keys(*names))]


def open_store(directory: Path, memory: int = 30, write_through: bool = False) -> BlockStore:
    return BlockStore(memory, DiskTier(directory, 100), write_through=write_through)


def test_a_put_of_other_bytes_keeps_the_first_and_is_counted():
    store = BlockStore(100)
    assert store.put([block("a")], writer=A).stored == 1
    result = store.put([other_bytes("a"), block("b")], writer=B)
    assert (result.stored, result.existing, result.kept_existing) == (1, 1, 1)  # b stored: the rest of the put
    assert served(store, "a", "b") == [block("a").data, block("b").data]
    assert store.stats().kept_existing_total == 1
    with pytest.raises(errors.ForeignBlockError):  # a stays A's: its writer did not change either
        store.delete(keys("a"), caller=B)
    store.check_integrity()


def test_a_put_of_the_same_bytes_is_existing_and_not_kept_apart():
    store = BlockStore(100)
    store.put([block("a")], writer=A)
    result = store.put([block("a")], writer=B)
    assert (result.stored, result.existing, result.kept_existing) == (0, 1, 0)
    assert store.stats().kept_existing_total == 0
    assert served(store, "a") == [block("a").data]


def test_a_delete_naming_another_writers_block_deletes_nothing_then_a_put_cannot_replace_it():
    store = BlockStore(100)
    store.put([block("a")], writer=A)
    store.put([block("mine")], writer=B)
    with pytest.raises(errors.ForeignBlockError, match=rf"keys\[1\] = {key('a').hex()} was put by another caller"):
        store.delete(keys("mine", "a"), caller=B)
    assert keys("mine", "a") == [k for k in keys("mine", "a") if k in store]  # atomic: "mine" kept too
    assert store.stats().foreign_deletes_total == 1
    assert store.put([other_bytes("a")], writer=B).kept_existing == 1  # the delete-then-put attack
    assert served(store, "a") == [block("a").data]
    assert store.delete(keys("mine", "nope"), caller=B) == 1  # its own block, and a key not stored: fine
    assert store.delete(keys("a"), caller=A) == 1
    assert len(store) == 0
    store.check_integrity()


def test_the_writer_of_a_disk_block_outlives_a_restart_and_a_disk_only_copy_is_compared(tmp_path):
    store = open_store(tmp_path, write_through=True)
    store.put([block("a")], writer=A)
    assert block_file.read_header(tmp_path / key("a").hex()).writer == A
    reopened = open_store(tmp_path)
    assert key("a") not in reopened.memory and key("a") in reopened
    assert reopened.put([other_bytes("a")], writer=B).kept_existing == 1
    with pytest.raises(errors.ForeignBlockError):
        reopened.delete(keys("a"), caller=B)
    assert served(reopened, "a") == [block("a").data]
    assert reopened.delete(keys("a"), caller=A) == 1 and not (tmp_path / key("a").hex()).exists()
    reopened.check_integrity()


def test_write_through_of_a_memory_only_key_writes_the_stored_bytes_not_the_puts(tmp_path):
    store = open_store(tmp_path, write_through=True)
    store.put([block("a")], writer=A)
    assert store.disk is not None
    store.disk.remove(key("a"))  # as if the disk tier had evicted it: a is in memory only
    staging = store.staging(B)
    staging.add(other_bytes("a"))
    try:
        assert store.put([other_bytes("a")], staging=staging, writer=B, verified=True).kept_existing == 1
    finally:
        staging.discard()
    on_disk = block_file.read_block(tmp_path / key("a").hex(), key("a"))
    assert (bytes(on_disk.data), on_disk.writer) == (block("a").data, A)
    assert [p.name for p in tmp_path.iterdir()] == [key("a").hex()]  # no staged file left behind
    store.check_integrity()


def test_a_memory_block_whose_bytes_changed_is_dropped_not_served():
    store = BlockStore(100)
    raw = bytearray(b"x" * 10)
    store.put([block("a"), StoredBlock(key("b"), memoryview(raw), "crc32", checksum("crc32", raw), LAYOUT_BYTES),
               block("c")])
    raw[3] ^= 1  # a bit flips in memory after the put
    assert [k for k in keys("a", "b", "c") if k in store] == keys("a", "b", "c")
    partial = store.get_prefix(keys("a", "b", "c"), allow_partial=True)
    assert [b.key for b in partial] == keys("a")
    assert key("b") not in store and store.stats().memory_corrupt_total == 1
    with pytest.raises(errors.MissingBlockError):
        store.get_prefix(keys("b"))
    store.check_integrity()


def test_a_memory_block_that_changed_is_served_from_its_intact_disk_copy(tmp_path):
    store = open_store(tmp_path, write_through=True)
    raw = bytearray(b"y" * 10)
    store.put([StoredBlock(key("a"), memoryview(raw), "crc32", checksum("crc32", raw), LAYOUT_BYTES)])
    raw[0] ^= 1
    assert served(store, "a") == [b"y" * 10]
    assert store.stats().memory_corrupt_total == 1
    store.check_integrity()


def test_a_disk_file_whose_data_and_checksum_were_both_rewritten_is_caught_by_the_digest(tmp_path):
    """Rewriting a block's data and the crc32 beside it is easy; the seal taken at Put still tells."""
    store = open_store(tmp_path, memory=10)
    store.put([block("a")], writer=A)
    store.put([block("b")], writer=A)  # a spills to disk: disk only
    path = tmp_path / key("a").hex()
    header = block_file.read_header(path)
    forged = StoredBlock(key("a"), b"z" * 10, "crc32", checksum("crc32", b"z" * 10), LAYOUT_BYTES,
                         header.digest, A)  # the old digest, new bytes and a matching crc32
    path.unlink()
    block_file.write_block(tmp_path, forged)
    assert digest_of("crc32", checksum("crc32", b"z" * 10)) != header.digest
    assert store.get_prefix(keys("a"), allow_partial=True) == []
    assert key("a") not in store and store.stats().disk_corrupt_total == 1
    store.check_integrity()


def test_a_file_of_the_old_format_is_dropped_on_restart(tmp_path):
    store = open_store(tmp_path, write_through=True)
    store.put([block("a")])
    path = tmp_path / key("a").hex()
    raw = bytearray(path.read_bytes())
    raw[4:6] = (1).to_bytes(2, "big")  # version 1
    path.write_bytes(bytes(raw))
    reopened = open_store(tmp_path)
    assert key("a") not in reopened and not path.exists()

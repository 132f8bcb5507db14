"""The memory tier: verified blocks in a dict, a byte capacity, LRU order (:class:`LruIndex`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from services.cache_store.block import StoredBlock
from services.cache_store.lru import LruIndex


class MemoryTier:
    def __init__(self, capacity_bytes: int) -> None:
        self.index = LruIndex(capacity_bytes)
        self.evictions_total = 0
        self.corrupt_total = 0  # blocks dropped because their bytes no longer matched their digest
        self._blocks: dict[bytes, StoredBlock] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    @property
    def capacity_bytes(self) -> int:
        return self.index.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self.index.used_bytes

    def get(self, key: bytes) -> StoredBlock | None:
        return self._blocks.get(key)

    def victims(self, nbytes: int, keep: Collection[bytes]) -> list[bytes] | None:
        return self.index.victims(nbytes, keep)

    def add(self, block: StoredBlock) -> None:
        """Insert as the most recent; the caller made room (see :meth:`victims`). ``block`` is sealed (has
        its digest: :meth:`StoredBlock.sealed`)."""
        assert block.digest, f"block {block.key.hex()} is not sealed"
        self.index.add(block.key, len(block.data))
        self._blocks[block.key] = block
        assert self.index.used_bytes <= self.capacity_bytes, "memory tier over capacity"

    def evict(self, key: bytes) -> StoredBlock:
        self.index.remove(key)
        self.evictions_total += 1
        return self._blocks.pop(key)

    def remove(self, key: bytes) -> None:
        """Drop ``key`` at its owner's request (not an eviction)."""
        self.index.remove(key)
        del self._blocks[key]

    def drop_corrupt(self, key: bytes) -> None:
        """Drop ``key``, found not to match its digest (counted in ``corrupt_total``)."""
        self.remove(key)
        self.corrupt_total += 1

    def touch(self, keys: Sequence[bytes]) -> None:
        self.index.touch(keys)

    def keys_lru_first(self) -> list[bytes]:
        return self.index.keys_lru_first()

    def check_integrity(self) -> None:
        actual = sum(len(b.data) for b in self._blocks.values())
        assert actual == self.used_bytes, f"memory used_bytes {self.used_bytes} != sum of blocks {actual}"
        assert set(self._blocks) == set(self.index), "memory blocks and LRU index differ"
        assert self.used_bytes <= self.capacity_bytes, f"memory used {self.used_bytes} > {self.capacity_bytes}"

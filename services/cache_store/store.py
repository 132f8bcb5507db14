"""In-memory content-addressed block store with a byte capacity and LRU eviction (no gRPC here).

A key is a block's chained hash; the value is its bytes plus the checksum they were verified against
and an opaque layout description. Blocks enter only verified and whole (``put`` checks every checksum
before changing anything), so a reader never sees a partial or corrupt block.

Recency: ``put`` and ``get_prefix`` refresh the blocks they touch; within one call a later key counts
as less recent than an earlier one, so the tail of a prefix chain is evicted before its head (the
leading blocks are the most shared). ``lookup`` does not refresh.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.cache_store.errors import (
    CorruptBlockError,
    MalformedPutError,
    MissingBlockError,
    StoreFullError,
)

CHECKSUMS: dict[str, Callable[[bytes], bytes]] = {
    "crc32": lambda data: zlib.crc32(data).to_bytes(4, "big"),
    "blake2b-128": lambda data: hashlib.blake2b(data, digest_size=16).digest(),
}


def checksum(algorithm: str, data: bytes) -> bytes:
    if algorithm not in CHECKSUMS:
        raise MalformedPutError("checksum_algorithm", f"{algorithm!r} is not one of {sorted(CHECKSUMS)}")
    return CHECKSUMS[algorithm](data)


@dataclass(frozen=True)
class StoredBlock:
    key: bytes
    data: bytes
    checksum_algorithm: str
    checksum: bytes
    layout: bytes = b""  # opaque (a serialized KVLayout); returned as given

    def verify(self) -> None:
        """Raise ``CorruptBlockError`` unless ``data`` matches ``checksum``."""
        actual = checksum(self.checksum_algorithm, self.data)
        if actual != self.checksum:
            raise CorruptBlockError(
                f"block {self.key.hex()}: {self.checksum_algorithm} checksum mismatch "
                f"(expected {self.checksum.hex()}, got {actual.hex()})"
            )


@dataclass(frozen=True)
class PutResult:
    stored: int
    existing: int
    evicted: int


class BlockStore:
    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes > 0, f"capacity_bytes must be positive, got {capacity_bytes}"
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.evictions_total = 0
        self.hit_blocks_total = 0
        self._blocks: OrderedDict[bytes, StoredBlock] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def keys_lru_first(self) -> list[bytes]:
        """Every key, in eviction order."""
        return list(self._blocks)

    def lookup(self, keys: Sequence[bytes]) -> int:
        """Length of the longest stored prefix of ``keys``. Does not refresh recency."""
        for i, key in enumerate(keys):
            if key not in self._blocks:
                return i
        return len(keys)

    def get_prefix(self, keys: Sequence[bytes], allow_partial: bool = False) -> list[StoredBlock]:
        """The blocks of ``keys`` in order, refreshed. A missing key raises ``MissingBlockError`` unless
        ``allow_partial``, which returns the longest stored prefix instead."""
        hits = self.lookup(keys)
        if hits < len(keys) and not allow_partial:
            raise MissingBlockError(f"keys[{hits}] = {keys[hits].hex()} is not stored")
        blocks = [self._blocks[key] for key in keys[:hits]]
        self._refresh(keys[:hits])
        self.hit_blocks_total += hits
        return blocks

    def put(self, blocks: Sequence[StoredBlock]) -> PutResult:
        """Store verified ``blocks`` atomically: every checksum and the capacity are checked first, and
        on any error nothing changes. Keys already stored are refreshed, not replaced."""
        new: dict[bytes, StoredBlock] = {}
        for block in blocks:
            block.verify()
            if block.key not in self._blocks:
                new.setdefault(block.key, block)
        needed = sum(len(b.data) for b in new.values())
        keep = {b.key for b in blocks}
        pinned = sum(len(self._blocks[key].data) for key in keep if key in self._blocks)
        if needed > self.capacity_bytes - pinned:
            raise StoreFullError(
                f"{needed} bytes of new blocks do not fit: capacity {self.capacity_bytes} bytes, "
                f"{pinned} of them held by blocks this put refreshes"
            )
        evicted = self._evict(needed - (self.capacity_bytes - self.used_bytes), keep)
        for block in new.values():
            self._blocks[block.key] = block
            self.used_bytes += len(block.data)
        self._refresh([b.key for b in blocks])
        return PutResult(stored=len(new), existing=len({b.key for b in blocks}) - len(new), evicted=evicted)

    def _refresh(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):  # the first key ends up most recent
            self._blocks.move_to_end(key)

    def _evict(self, nbytes: int, keep: set[bytes]) -> int:
        """Drop least recently used blocks outside ``keep`` until ``nbytes`` are freed."""
        victims: list[bytes] = []
        freed = 0
        for key, block in self._blocks.items():
            if freed >= nbytes:
                break
            if key not in keep:
                victims.append(key)
                freed += len(block.data)
        for key in victims:
            self.used_bytes -= len(self._blocks.pop(key).data)
        self.evictions_total += len(victims)
        return len(victims)

    def check_integrity(self) -> None:
        actual = sum(len(b.data) for b in self._blocks.values())
        assert actual == self.used_bytes, f"used_bytes {self.used_bytes} != sum of blocks {actual}"
        assert self.used_bytes <= self.capacity_bytes, f"used {self.used_bytes} > {self.capacity_bytes}"

"""Byte-budgeted LRU order of keys, shared by both tiers (sizes only; the tiers hold the bytes).

Recency: :meth:`LruIndex.touch` of several keys makes the first one the most recent, so the tail of a
prefix chain is evicted before its head (the leading blocks are the most shared).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Sequence


class LruIndex:
    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes > 0, f"capacity_bytes must be positive, got {capacity_bytes}"
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._sizes: OrderedDict[bytes, int] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, key: bytes) -> bool:
        return key in self._sizes

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._sizes)

    def size_of(self, key: bytes) -> int:
        return self._sizes[key]

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def add(self, key: bytes, size: int) -> None:
        """Insert ``key`` as the most recent."""
        assert key not in self._sizes, f"{key.hex()} is already indexed"
        self._sizes[key] = size
        self.used_bytes += size

    def remove(self, key: bytes) -> int:
        size = self._sizes.pop(key)
        self.used_bytes -= size
        return size

    def touch(self, keys: Sequence[bytes]) -> None:
        """Make ``keys`` the most recent, the first key most of all; keys not indexed are skipped."""
        for key in reversed(keys):
            if key in self._sizes:
                self._sizes.move_to_end(key)

    def victims(self, nbytes: int, keep: Collection[bytes] = ()) -> list[bytes] | None:
        """Least recently used keys outside ``keep`` that free ``nbytes`` beyond the free space, or None
        when even all of them would not."""
        need = nbytes - self.free_bytes
        chosen: list[bytes] = []
        for key, size in self._sizes.items():
            if need <= 0:
                break
            if key not in keep:
                chosen.append(key)
                need -= size
        return chosen if need <= 0 else None

    def evictable_bytes(self, keep: Iterable[bytes]) -> int:
        """Bytes :meth:`victims` could free with ``keep`` held back (the free space included)."""
        held = sum(self._sizes[key] for key in set(keep) if key in self._sizes)
        return self.capacity_bytes - held

    def keys_lru_first(self) -> list[bytes]:
        return list(self._sizes)

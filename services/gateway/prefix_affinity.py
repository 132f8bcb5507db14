"""Which prompt prefixes each node holds, as far as the gateway can tell: an approximate index built from the
block hashes of what it routed (no events from the nodes), for cache-aware routing (``router.py``).

A prompt's full blocks are hashed as a chain (each hash covers the block and every block before it), the way
the nodes' prefix caches key their blocks, so "node N holds the first k hashes" means N computed (or
received) that k-block prefix recently. Each node's entries are kept in LRU order and capped at its
``blocks_total`` (its pool cannot hold more; the nodes evict least recently used cached blocks too). The
index is a hint: a node may have evicted a block sooner, or restarted, and then the request computes a
little more than hoped — never a wrong result. Pure logic, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_BLOCK_SIZE = 16


def block_hashes(prompt_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[int, ...]:
    """The chained hashes of the prompt's full blocks (a partial last block is never shared)."""
    hashes, previous = [], 0
    for start in range(0, len(prompt_ids) - block_size + 1, block_size):
        previous = hash((previous, *prompt_ids[start:start + block_size]))
        hashes.append(previous)
    return tuple(hashes)


class PrefixAffinity:
    def __init__(self) -> None:
        self._held: dict[str, OrderedDict[int, None]] = {}

    def matched_blocks(self, address: str, hashes: Sequence[int]) -> int:
        """How many leading blocks of the prompt ``address`` holds, by this index."""
        held = self._held.get(address)
        if not held:
            return 0
        count = 0
        for value in hashes:
            if value not in held:
                break
            count += 1
        return count

    def record(self, address: str, hashes: Sequence[int], capacity_blocks: int) -> None:
        """``address`` now holds the prompt's blocks (most recently used); the oldest beyond
        ``capacity_blocks`` are forgotten."""
        held = self._held.setdefault(address, OrderedDict())
        for value in hashes:
            held[value] = None
            held.move_to_end(value)
        while len(held) > max(capacity_blocks, 1):
            held.popitem(last=False)

    def forget(self, addresses_kept: Sequence[str]) -> None:
        """Drop the entries of nodes no longer listed."""
        for address in set(self._held) - set(addresses_kept):
            del self._held[address]

    def size(self, address: str) -> int:
        return len(self._held.get(address, ()))

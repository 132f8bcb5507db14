"""O(1) LRU of free blocks: an intrusive doubly linked list threaded through the KVBlocks."""

from __future__ import annotations

from collections.abc import Iterable

from kvcache.block import KVBlock
from kvcache.errors import BlockStateError


class FreeBlockQueue:
    """Blocks with ref_count 0, in reuse order: the head is reused (evicted) next, the tail last.

    The links live in the blocks themselves, so ``remove`` of a block anywhere in the queue (a prefix hit
    reviving a cached block) is O(1) with no search. Two sentinel blocks (id -1) bracket the list so
    no operation special-cases the ends.
    """

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        self._head = KVBlock(block_id=-1)
        self._tail = KVBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def popleft(self) -> KVBlock:
        """Detach and return the head block (the next to reuse); raises on an empty queue."""
        first = self._head.next_free
        assert first is not None
        if first is self._tail:
            raise BlockStateError("popleft from an empty free queue")
        self.remove(first)
        return first

    def append(self, block: KVBlock) -> None:
        """Put ``block`` at the tail (the last to be reused)."""
        if block.in_free_queue:
            raise BlockStateError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        block.prev_free, block.next_free = last, self._tail
        last.next_free = block
        self._tail.prev_free = block
        self._len += 1

    def remove(self, block: KVBlock) -> None:
        """Detach ``block`` from wherever it is in the queue."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise BlockStateError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def blocks(self) -> list[KVBlock]:
        """Head to tail snapshot, for tests and debugging (O(n))."""
        out: list[KVBlock] = []
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None and node.next_free is not None, "free queue link broken"
            assert node.next_free.prev_free is node, f"free queue back link broken at {node.block_id}"
            out.append(node)
            node = node.next_free
        assert len(out) == self._len, f"free queue holds {len(out)} blocks but counts {self._len}"
        return out

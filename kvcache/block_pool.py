"""The block allocator: free queue (LRU) + prefix index + reference counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from kvcache.block import KVBlock
from kvcache.errors import BlockStateError, DoubleFreeError
from kvcache.free_queue import FreeBlockQueue
from kvcache.hashing import BlockHash
from kvcache.prefix_index import PrefixIndex


class BlockPool:
    """Every KV block of one node, each in exactly one state:

    * free: ref_count 0, no hash; in the free queue.
    * cached: ref_count 0, hashed and indexed; in the free queue, findable until popped for reuse.
    * used: ref_count > 0 (hashed or not); not in the free queue.

    ``allocate`` pops from the free-queue head, evicting a cached block it pops; ``free`` appends at the
    tail, so the queue order is least-recently-freed first. ``allocate`` is the only way a block leaves
    the free queue for new content.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        assert num_blocks > 0, f"num_blocks must be positive, got {num_blocks}"
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(block_id=i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.index = PrefixIndex()
        self.num_evictions = 0
        """Cached blocks that lost their KV to reuse (monotonic, for metrics)."""
        self._num_cached = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable now: never-used/uncached free plus cached (evictable)."""
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Evictable cached blocks: ref_count 0 and still in the prefix index."""
        return self._num_cached

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        """The block holding the computed KV of ``block_hash``, used or cached; None on a miss."""
        return self.index.get(block_hash)

    def allocate(self, n: int) -> list[KVBlock] | None:
        """Take ``n`` blocks from the free-queue head with ref_count 1, or None (no change) if short."""
        assert n >= 0, f"cannot allocate {n} blocks"
        if n > len(self.free_queue):
            return None
        taken = [self.free_queue.popleft() for _ in range(n)]
        for block in taken:
            assert block.ref_count == 0, f"block {block.block_id} in free queue with ref {block.ref_count}"
            if block.block_hash is not None:
                self._evict(block)
            block.ref_count = 1
        return taken

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add one reference to each block; a cached block (ref 0) leaves the free queue (prefix hit).

        Touching a free block without a hash is an error: its content is garbage.
        """
        blocks = list(blocks)
        for block in blocks:
            if block.ref_count == 0 and block.block_hash is None:
                raise BlockStateError(f"touching free uncached block {block.block_id}")
        for block in blocks:
            if block.ref_count == 0:
                self.free_queue.remove(block)
                self._num_cached -= 1
            block.ref_count += 1

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference from each block; those reaching 0 go to the free-queue tail in REVERSE order.

        Pass a request's blocks in table order: its deepest block then sits nearest the head and is evicted
        first, while its leading (most shared) blocks stay cached longest. Cached blocks keep their hash.
        Raises DoubleFreeError (changing nothing) if any block would drop below zero.
        """
        for block, times in Counter(blocks).items():
            if times > block.ref_count:
                raise DoubleFreeError(f"block {block.block_id} freed {times}x with ref {block.ref_count}")
        for block in reversed(blocks):
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue.append(block)
                if block.block_hash is not None:
                    self._num_cached += 1

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> bool:
        """Publish a used block's computed KV under ``block_hash``; True if the block is now indexed.

        Call only for FULL blocks whose KV exists. If another block already holds ``block_hash`` (the same
        content computed twice), the existing entry wins and ``block`` stays unhashed: it becomes plain
        free when released. Re-caching a block under its own hash is a no-op. No-op if caching is off.
        """
        if not self.enable_caching:
            return False
        if block.ref_count == 0:
            raise BlockStateError(f"caching block {block.block_id}, which nobody holds")
        if block.block_hash is not None:
            if block.block_hash != block_hash:
                raise BlockStateError(f"block {block.block_id} is already indexed under another key")
            return True
        if block_hash in self.index:
            return False
        block.block_hash = block_hash
        self.index.insert(block_hash, block)
        return True

    def refresh(self, blocks: Iterable[KVBlock]) -> None:
        """Move the cached (ref 0) ones of ``blocks`` to the free-queue tail, in the order given, as if just freed:
        their content was just computed again, so it is in use (the last one given is evicted last)."""
        for block in blocks:
            if block.ref_count == 0 and block.block_hash is not None:
                self.free_queue.remove(block)
                self.free_queue.append(block)

    def evict_cached(self, n: int) -> int:
        """Drop the hashes of up to ``n`` cached blocks, head first (they stay free); returns how many."""
        evicted = 0
        for block in self.free_queue.blocks():
            if evicted == n:
                break
            if block.block_hash is not None:
                self._evict(block)
                evicted += 1
        return evicted

    def reset_prefix_cache(self) -> int:
        """Forget every cached (evictable) block; used blocks keep their keys. Returns how many dropped."""
        return self.evict_cached(self._num_cached)

    def _evict(self, block: KVBlock) -> None:
        assert block.ref_count == 0 and block.block_hash is not None, f"evicting live block {block}"
        self.index.remove(block.block_hash, block)
        block.block_hash = None
        self._num_cached -= 1
        self.num_evictions += 1

    def check_integrity(self, owners: Mapping[str, Sequence[int]] | None = None) -> None:
        """Assert the pool's invariants; with ``owners`` (owner id → block ids) also the ref counts."""
        queued = self.free_queue.blocks()
        assert all(b.ref_count == 0 for b in queued), "a referenced block is in the free queue"
        assert len({id(b) for b in queued}) == len(queued), "a block is in the free queue twice"
        unreferenced = [b for b in self.blocks if b.ref_count == 0]
        assert len(queued) == len(unreferenced), f"{len(queued)} queued but {len(unreferenced)} at ref 0"
        assert all(b.ref_count >= 0 for b in self.blocks), "negative ref count"
        for block_hash, block in self.index.items():
            assert block.block_hash == block_hash, f"index entry {block_hash.hex()} mislabels {block}"
        hashed = [b for b in self.blocks if b.block_hash is not None]
        assert len(hashed) == len(self.index), f"{len(hashed)} hashed blocks, {len(self.index)} indexed"
        cached = sum(1 for b in unreferenced if b.block_hash is not None)
        assert cached == self._num_cached, f"{cached} cached blocks but counter says {self._num_cached}"
        uncached_free = len(unreferenced) - cached
        used = self.num_blocks - len(unreferenced)
        assert uncached_free + cached + used == self.num_blocks == len(self.blocks), "block states leak"
        if owners is None:
            return
        holders: Counter[int] = Counter()
        for owner, block_ids in owners.items():
            assert len(set(block_ids)) == len(block_ids), f"{owner} lists a block twice: {block_ids}"
            holders.update(block_ids)
        for block in self.blocks:
            assert block.ref_count == holders[block.block_id], (
                f"block {block.block_id} has ref {block.ref_count} but {holders[block.block_id]} owners"
            )
        assert set(holders) <= set(range(self.num_blocks)), "an owner lists a block id out of range"

"""Map from chained block key to the block that holds that computed KV."""

from __future__ import annotations

from collections.abc import ItemsView

from kvcache.block import KVBlock
from kvcache.hashing import BlockHash


class PrefixIndex:
    """At most one block per key. Only blocks whose KV has been computed (or received) are inserted.

    The index does not own blocks: an indexed block may be in use (ref > 0) or cached in the free queue.
    BlockPool keeps ``block.block_hash`` and this map in step.
    """

    def __init__(self) -> None:
        self._blocks: dict[BlockHash, KVBlock] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: BlockHash) -> KVBlock | None:
        return self._blocks.get(block_hash)

    def insert(self, block_hash: BlockHash, block: KVBlock) -> None:
        assert block_hash not in self._blocks, f"key {block_hash.hex()} already indexed"
        self._blocks[block_hash] = block

    def remove(self, block_hash: BlockHash, block: KVBlock) -> None:
        """Drop the entry of ``block_hash``, which must point at ``block``."""
        held = self._blocks.pop(block_hash, None)
        assert held is block, f"key {block_hash.hex()} is not indexed to block {block.block_id}"

    def items(self) -> ItemsView[BlockHash, KVBlock]:
        return self._blocks.items()

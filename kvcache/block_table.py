"""Per-request block tables."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcache.hashing import BlockHash


@dataclass(slots=True)
class RequestBlocks:
    """The blocks one request holds, in token order, and how far its prefix caching has got.

    ``block_hashes[i]`` is the chained key of block i; only leading FULL computed blocks (or prefix hits)
    have one, so ``len(block_hashes) <= len(block_ids)``. ``num_cached_blocks`` counts the leading blocks
    already offered to the prefix index (a duplicate-content block is offered but stays unindexed).
    """

    request_id: str
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_cached_blocks: int = 0

    def check(self) -> None:
        assert self.num_cached_blocks <= len(self.block_hashes) <= len(self.block_ids), (
            f"{self.request_id}: {self.num_cached_blocks} cached, {len(self.block_hashes)} hashed, "
            f"{len(self.block_ids)} blocks"
        )

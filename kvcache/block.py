"""One physical KV block, as the control plane sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcache.hashing import BlockHash


@dataclass(slots=True, eq=False)
class KVBlock:
    """A block of the paged KV pool.

    ``ref_count`` is the number of owners (requests, later leases) holding it; 0 means it sits in the
    free queue. ``block_hash`` is set while the block is in the prefix index (its KV is computed and
    reusable); a free block that keeps its hash is *cached*: findable until it is evicted for reuse.
    ``prev_free``/``next_free`` are the intrusive links of FreeBlockQueue; both are None exactly when
    the block is not in the queue. Identity equality (``eq=False``): two blocks are never "equal".
    """

    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)

    @property
    def in_free_queue(self) -> bool:
        return self.prev_free is not None

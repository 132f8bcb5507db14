"""KVCacheManager: the only kvcache class the engine scheduler talks to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcache.block import KVBlock
from kvcache.block_pool import BlockPool
from kvcache.block_table import RequestBlocks
from kvcache.errors import BlockTableError, StalePrefixError, UnknownRequestError
from kvcache.hashing import BlockHash, hash_block, hash_token_blocks


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Leading full blocks of a token sequence whose KV is already in the prefix index."""

    block_ids: tuple[int, ...] = ()
    num_tokens: int = 0
    block_hashes: tuple[BlockHash, ...] = ()

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


NO_PREFIX = PrefixMatch()


class KVCacheManager:
    """Block tables of the running requests on top of one BlockPool, with prefix caching.

    Scheduler protocol, per request::

        prefix = kv.match_prefix(prompt)                   # pure lookup
        new = kv.allocate(rid, n_tokens, prefix)            # None: short of blocks, nothing changed
        ... model computes tokens ...
        kv.cache_computed(rid, tokens, num_computed)        # publish the newly full computed blocks
        kv.allocate(rid, n_tokens + k)                      # grow: next chunk, or decode (+1 token)
        kv.free(rid)                                        # blocks become cached/free, tail first

    Match and the first allocate must happen in the same step with no other pool mutation in between,
    otherwise a hit may have been evicted (``StalePrefixError``).

    Every block an owner gains comes through ``allocate`` (capacity check, touch of hits, pool pop), and
    owners are plain string ids; a later "reserved (leased) blocks" feature can be an owner of its own
    kind in the same tables, checked by the same ``check_integrity``.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        fingerprint: bytes,
        enable_prefix_caching: bool = True,
    ) -> None:
        assert block_size > 0, f"block_size must be positive, got {block_size}"
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.fingerprint = fingerprint
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self._tables: dict[str, RequestBlocks] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable now (free + cached-evictable)."""
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached-evictable blocks count as free)."""
        return self.pool.num_used_blocks / self.num_blocks

    def hash_blocks(self, token_ids: Sequence[int]) -> list[BlockHash]:
        """Chained keys of the full blocks of ``token_ids`` under this manager's model fingerprint."""
        return hash_token_blocks(token_ids, self.block_size, self.fingerprint)

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """Longest run of leading full blocks found in the index; always leaves >= 1 token to compute.

        Pure lookup: no reference is taken, so the hits stay evictable until ``allocate`` touches them.
        """
        if not self.enable_prefix_caching:
            return NO_PREFIX
        max_blocks = max(0, (len(token_ids) - 1) // self.block_size)
        ids: list[int] = []
        hashes: list[BlockHash] = []
        parent: BlockHash | None = None
        for i in range(max_blocks):
            block_tokens = token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = hash_block(parent, block_tokens, self.fingerprint)
            block = self.pool.get_cached_block(parent)
            if block is None:
                break
            ids.append(block.block_id)
            hashes.append(parent)
        return PrefixMatch(tuple(ids), len(ids) * self.block_size, tuple(hashes))

    def blocks_needed(self, request_id: str, num_tokens: int, prefix: PrefixMatch | None = None) -> int:
        """Free blocks that ``allocate(request_id, num_tokens, prefix)`` would consume.

        That is the new blocks PLUS every prefix hit that is currently cached-evictable (ref 0): touching
        it takes it out of the free queue, so it uses free capacity just like a new block. Hits held by
        another request cost nothing. Compare against ``num_free_blocks``.
        """
        hits, num_new = self._plan(request_id, num_tokens, prefix)
        return num_new + sum(1 for block in hits if block.ref_count == 0)

    def can_allocate(self, request_id: str, num_tokens: int, prefix: PrefixMatch | None = None) -> bool:
        return self.blocks_needed(request_id, num_tokens, prefix) <= self.pool.num_free_blocks

    def allocate(
        self, request_id: str, num_tokens: int, prefix: PrefixMatch | None = None, keep_free: int = 0
    ) -> list[int] | None:
        """Make the request's table cover ``num_tokens`` tokens in total; returns the new block ids.

        First call of a request: ``prefix`` hits are referenced and become its leading blocks. Later calls
        (``prefix`` None) grow the table for the next prefill chunk or decode token; asking for no more
        than the current capacity returns ``[]``. Returns None, changing nothing, if that would leave fewer
        than ``keep_free`` free blocks.
        """
        hits, num_new = self._plan(request_id, num_tokens, prefix)
        if num_new + sum(1 for block in hits if block.ref_count == 0) > self.pool.num_free_blocks - keep_free:
            return None
        self.pool.touch(hits)  # before allocating, so popping the free-queue head cannot evict a hit
        new_blocks = self.pool.allocate(num_new)
        assert new_blocks is not None, "free-capacity check passed but the pool came up short"
        table = self._tables.get(request_id)
        if table is None:
            assert prefix is not None or not hits
            table = RequestBlocks(
                request_id=request_id,
                block_ids=[block.block_id for block in hits],
                block_hashes=list(prefix.block_hashes) if prefix else [],
                num_cached_blocks=len(hits),
            )
            self._tables[request_id] = table
        new_ids = [block.block_id for block in new_blocks]
        table.block_ids.extend(new_ids)
        return new_ids

    def _plan(
        self, request_id: str, num_tokens: int, prefix: PrefixMatch | None
    ) -> tuple[list[KVBlock], int]:
        """(prefix hit blocks to touch, number of new blocks) for an allocate call; validates arguments."""
        if num_tokens < 0:
            raise BlockTableError(f"{request_id}: negative token count {num_tokens}")
        required = -(-num_tokens // self.block_size)
        table = self._tables.get(request_id)
        if table is not None:
            if prefix is not None and prefix.block_ids:
                raise BlockTableError(f"{request_id}: a prefix can only be given on the first allocate")
            return [], max(0, required - len(table.block_ids))
        hits = self._validated_hits(prefix or NO_PREFIX)
        if num_tokens < (prefix.num_tokens if prefix else 0):
            raise BlockTableError(f"{request_id}: {num_tokens} tokens do not cover its prefix match")
        return hits, max(0, required - len(hits))

    def _validated_hits(self, prefix: PrefixMatch) -> list[KVBlock]:
        assert len(prefix.block_ids) == len(prefix.block_hashes), "malformed PrefixMatch"
        assert prefix.num_tokens == len(prefix.block_ids) * self.block_size, "malformed PrefixMatch"
        hits = []
        for block_id, block_hash in zip(prefix.block_ids, prefix.block_hashes, strict=True):
            block = self.pool.get_cached_block(block_hash)
            if block is None or block.block_id != block_id:
                raise StalePrefixError(f"prefix hit {block_id} ({block_hash.hex()}) was evicted")
            hits.append(block)
        return hits

    def cache_computed(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Publish every block made FULL by the first ``num_computed_tokens`` computed tokens.

        ``token_ids`` is the request's whole sequence so far (prompt + output). Keys are chained
        incrementally from the ones already stored on the table; partial blocks never enter the index. A key
        another block holds already stays that block's, which counts as used again (a hybrid model's request
        recomputes cached blocks its state checkpoints do not cover, and saves a checkpoint on them).
        """
        table = self._table(request_id)
        if num_computed_tokens > len(token_ids):
            raise BlockTableError(f"{request_id}: {num_computed_tokens} computed of {len(token_ids)} tokens")
        num_full = num_computed_tokens // self.block_size
        if num_full > len(table.block_ids):
            raise BlockTableError(f"{request_id}: computed {num_full} full blocks but holds fewer")
        if not self.enable_prefix_caching:
            return
        table.block_hashes.extend(self._chained(table.block_hashes, token_ids, num_full))
        computed_again = []  # keys another block already holds: that one is refreshed, its leading blocks last
        for i in range(table.num_cached_blocks, num_full):
            if not self.pool.cache_block(self.pool.blocks[table.block_ids[i]], table.block_hashes[i]):
                computed_again.append(self.pool.get_cached_block(table.block_hashes[i]))
        self.pool.refresh(reversed([b for b in computed_again if b is not None]))
        table.num_cached_blocks = max(table.num_cached_blocks, num_full)

    def _chained(self, known: Sequence[BlockHash], token_ids: Sequence[int], end: int) -> list[BlockHash]:
        """The keys of blocks ``len(known) .. end`` of ``token_ids``, chained on from ``known``."""
        keys, parent = [], known[-1] if known else None
        for i in range(len(known), end):
            parent = hash_block(parent, token_ids[i * self.block_size : (i + 1) * self.block_size], self.fingerprint)
            keys.append(parent)
        return keys

    def prefix_key(self, request_id: str, token_ids: Sequence[int], num_tokens: int) -> BlockHash:
        """The chained key of the block that ends at ``num_tokens`` (a multiple of the block size) of ``token_ids``,
        the request's whole sequence, chained on from the keys its table holds (they need not be published)."""
        if num_tokens <= 0 or num_tokens % self.block_size or num_tokens > len(token_ids):
            raise BlockTableError(f"{request_id}: no full block ends at token {num_tokens} of {len(token_ids)}")
        known, end = self._table(request_id).block_hashes, num_tokens // self.block_size
        return known[end - 1] if end <= len(known) else self._chained(known, token_ids, end)[-1]

    def free(self, request_id: str) -> None:
        """Release every block of the request; its cached blocks stay findable, deepest evicted first."""
        table = self._tables.pop(request_id, None)
        if table is None:
            raise UnknownRequestError(f"free of unknown request {request_id!r}")
        self.pool.free([self.pool.blocks[i] for i in table.block_ids])

    def has_request(self, request_id: str) -> bool:
        return request_id in self._tables

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block ids in token order (a copy)."""
        return list(self._table(request_id).block_ids)

    def block_hashes(self, request_id: str) -> list[BlockHash]:
        """Keys of the request's leading full computed blocks (a copy)."""
        return list(self._table(request_id).block_hashes)

    def num_tokens_capacity(self, request_id: str) -> int:
        return len(self._table(request_id).block_ids) * self.block_size

    def _table(self, request_id: str) -> RequestBlocks:
        table = self._tables.get(request_id)
        if table is None:
            raise UnknownRequestError(f"unknown request {request_id!r}")
        return table

    def check_integrity(self) -> None:
        """Assert pool invariants with every block table as an owner."""
        for table in self._tables.values():
            table.check()
        self.pool.check_integrity({rid: table.block_ids for rid, table in self._tables.items()})

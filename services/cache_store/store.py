"""Content-addressed block store: a memory tier, an optional disk tier beneath it, and leases (no gRPC).

Keys are 32 bytes, model fingerprint ‖ block id (:mod:`services.cache_store.keys`). Blocks enter only
verified and whole: ``put`` checks every checksum and makes its room before changing anything, so a
rejected put leaves the store as it was and a reader never sees a partial or corrupt block.

Tiers: new blocks go to memory. A block evicted from memory is written to disk (if the store has a disk
tier and the block is not there yet); the disk tier evicts its own least recent files past its capacity.
With ``write_through`` every put also writes its blocks to disk before it returns. A Get of a block found
only on disk reads and verifies its file as it streams and promotes it to memory; a damaged or missing
file makes that block missing. A block may be in both tiers.

Recency: ``put`` and a Get refresh the blocks they touch; within one call the first key is the most
recent, so the tail of a prefix chain is evicted before its head. ``lookup`` does not refresh. Disk
recency moves on disk writes and disk hits only.

Leases: a Get pins the blocks it streams (:mod:`services.cache_store.leases`) until it ends, or ``lease_s``
after it began at the latest (serving blocks does not renew the lease: a slow reader cannot stretch it);
eviction in either tier skips pinned blocks, and a put that cannot make room because of them is refused.
One caller's live leases pin at most ``lease_share_bytes`` (half the memory tier) together: a Get that would
take its caller past that is refused ``StoreFullError`` naming the bound, or, with ``allow_partial``, serves
the longest prefix that fits (the keys past it count as misses). So one node identity reading slowly can
hold at most half the memory tier from everyone else's puts, and for at most ``lease_s`` per Get.

Unfinished puts: the bytes their blocks announce are staged in memory until the put ends; ``put_budget``
(:class:`services.cache_store.assembly.StagingBudget`) bounds them store-wide (twice the memory tier's
capacity) and per caller (the capacity: half the budget, and the most one put may bring), so a dozen stalled
put streams cannot grow the process without bound, nor one caller's stalled puts shut the others out.

Delete: a decode node removes its preempted requests' copies (request-scoped keys) once it read them back
or no longer wants them, so they do not crowd out prefix blocks; a block a Get is streaming is kept.

A key, once stored, never changes bytes:

- First writer wins: a put of a stored key keeps the stored block (bytes, layout, writer) and only
  refreshes it. When the put's bytes differ (the store's digest, :mod:`services.cache_store.block`)
  the put still succeeds, the rest of it stored as usual, and the key counts in ``PutResult.kept_existing``:
  KV computed for the same prefix by two prefill nodes may legitimately differ in the last bits (bf16 batch
  nondeterminism), so the second writer must not fail its request, and whoever wrote first is served.
- Writer-bound deletes: every block records its writer (the caller's identity,
  ``services.common.tls.roles.caller_name``, kept in the disk file too); a delete naming any stored key another
  caller wrote raises ``ForeignBlockError`` and deletes nothing of its keys (atomic, like a put). So one
  node's identity can neither remove nor, by deleting and putting again, replace another's block.
- Checked on read: a Get re-checks each block's digest before it is sent (memory and disk alike); a block
  whose bytes no longer match is dropped (``memory_corrupt_total`` / ``disk_corrupt_total``, logged) and
  treated as missing — NOT_FOUND, or the shorter prefix with ``allow_partial``.

Counters: ``hits_total`` blocks served by Get, ``disk_hits_total`` of those read from disk,
``misses_total`` keys not served: for a Get every requested key past the blocks it served, for a Lookup
at most one per call (its first key not stored; a prefill node looks a whole prompt up before it gets
the hits, and those keys would otherwise count twice). A restore Get (a decode node reading back a
request's own KV, not a prefix) counts its blocks in ``restored_blocks_total`` only: neither hits nor
misses, which measure prefix reuse.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import structlog

from services.cache_store.assembly import StagingBudget
from services.cache_store.block import CHECKSUMS, StoredBlock, checksum
from services.cache_store.disk_tier import DiskTier, PutStaging
from services.cache_store.errors import (
    DiskWriteError,
    ForeignBlockError,
    MissingBlockError,
    StoreFullError,
)
from services.cache_store.keys import check_keys
from services.cache_store.leases import Leases
from services.cache_store.memory_tier import MemoryTier
from services.cache_store.reader import BlockReader

__all__ = ["CHECKSUMS", "BlockReader", "BlockStore", "PutResult", "PutStaging", "StoreStats", "StoredBlock",
           "checksum"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PutResult:
    stored: int
    existing: int  # keys already stored: refreshed, never replaced
    kept_existing: int  # of those, stored with other bytes than this put's: the stored block was kept
    evicted: int  # blocks dropped from memory to make room (written to disk first when there is one)


@dataclass(frozen=True)
class StoreStats:
    blocks: int  # distinct blocks in either tier
    memory_blocks: int
    memory_bytes_total: int
    memory_bytes_used: int
    disk_blocks: int
    disk_bytes_total: int  # 0 = no disk tier
    disk_bytes_used: int
    hits_total: int
    disk_hits_total: int
    misses_total: int
    restored_blocks_total: int
    memory_evictions_total: int
    disk_evictions_total: int  # files deleted: evicted past capacity, or found damaged when read
    disk_corrupt_total: int  # of those, damaged or missing files
    disk_write_failures_total: int  # blocks evicted from memory that could not be written to disk
    leases: int
    memory_corrupt_total: int = 0  # memory blocks dropped because their bytes no longer matched their digest
    kept_existing_total: int = 0  # blocks put again with other bytes: the first writer's kept
    foreign_deletes_total: int = 0  # Deletes refused: a key of theirs was written by another caller


@dataclass(frozen=True)
class StoredRecord:
    """What the store knows of a stored block without reading its data."""

    digest: bytes
    writer: str


class BlockStore:
    def __init__(self, capacity_bytes: int, disk: DiskTier | None = None, *, write_through: bool = False,
                 lease_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        assert disk is not None or not write_through, "write_through needs a disk tier"
        self.memory = MemoryTier(capacity_bytes)
        self.disk = disk
        self.write_through = write_through
        self.leases = Leases(lease_s, clock)
        # what one caller's live Gets may lease together: half the memory tier, the rest stays for the others
        self.lease_share_bytes = capacity_bytes // 2
        # bytes staged by unfinished puts: twice the memory tier's capacity in all, and one caller's at most the
        # capacity (the most one put may bring, as before), so one caller never takes more than half
        self.put_budget = StagingBudget(2 * capacity_bytes, capacity_bytes)
        self.hits_total = 0
        self.disk_hits_total = 0
        self.misses_total = 0
        self.restored_blocks_total = 0
        self.disk_write_failures_total = 0
        self._disk_failing = False  # the last spill failed: log the next success, not each failure
        self.deleted_total = 0
        self.kept_existing_total = 0
        self.foreign_deletes_total = 0
        self._logged_kept: set[str] = set()  # writers whose differing re-puts were logged
        self._logged_foreign: set[tuple[str, str]] = set()  # (caller, writer) refusals logged

    @property
    def capacity_bytes(self) -> int:
        """The memory tier's capacity: the most one put may bring."""
        return self.memory.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self.memory.used_bytes

    def __contains__(self, key: bytes) -> bool:
        return key in self.memory or (self.disk is not None and key in self.disk)

    def __len__(self) -> int:
        """Distinct blocks stored, in either tier."""
        if self.disk is None:
            return len(self.memory)
        both = sum(1 for key in self.memory.index if key in self.disk)
        return len(self.memory) + len(self.disk) - both

    def lookup(self, keys: Sequence[bytes], fingerprint: bytes = b"") -> int:
        """Length of the longest prefix of ``keys`` stored in either tier. Does not refresh recency."""
        check_keys(keys, fingerprint)
        hits = self._stored_prefix(keys)
        if hits < len(keys):
            self.misses_total += 1
        return hits

    def open_get(self, keys: Sequence[bytes], allow_partial: bool = False, fingerprint: bytes = b"",
                 restore: bool = False, caller: str | None = None) -> BlockReader:
        """A reader of the blocks of ``keys`` in order, holding a lease on them until closed (or ``lease_s``
        from now). A key not stored raises ``MissingBlockError`` now, unless ``allow_partial``: the reader
        then serves the longest stored prefix. ``restore``: counted as a restore, not as hits and misses.

        ``caller`` (the servicer always names one): its live leases may pin at most
        :attr:`lease_share_bytes` together; past that ``StoreFullError`` and nothing changes, or with
        ``allow_partial`` the prefix is cut where it would pass. ``None``: not bounded (the store's own use)."""
        check_keys(keys, fingerprint)
        hits = self._stored_prefix(keys)
        if hits < len(keys) and not allow_partial:
            if not restore:
                self.misses_total += len(keys) - hits
            raise MissingBlockError(f"keys[{hits}] = {keys[hits].hex()} is not stored")
        # memory bytes of each stored leading key (0: on disk only, pinned there only)
        sizes = [self.memory.index.size_of(key) if key in self.memory else 0 for key in keys[:hits]]
        if caller is not None:
            hits = self._leasable(sizes, allow_partial, caller)
        if hits < len(keys) and not restore:
            self.misses_total += len(keys) - hits
        prefix = list(keys[:hits])
        in_memory = [key for key in prefix if key in self.memory]
        nbytes = sum(sizes[:hits])
        self.memory.touch(prefix)
        return BlockReader(self, prefix, allow_partial, self.leases.acquire(prefix, in_memory, caller, nbytes),
                           restore)

    def _leasable(self, sizes: Sequence[int], allow_partial: bool, caller: str) -> int:
        """How many of the stored leading keys (their memory bytes ``sizes``) ``caller`` may lease: all of
        them, or with ``allow_partial`` as many as keep its leased memory bytes within its share;
        ``StoreFullError`` without."""
        held = self.leases.held_by(caller)
        room = self.lease_share_bytes - held
        nbytes = 0
        for i, size in enumerate(sizes):
            if nbytes + size > room:
                if allow_partial:
                    return i
                raise StoreFullError(
                    f"Get leasing {sum(sizes)} bytes of the memory tier refused: the Gets in progress of {caller} "
                    f"lease {held} bytes already, at most {self.lease_share_bytes} bytes per caller (half the "
                    f"memory tier's capacity of {self.capacity_bytes}), so that blocks being read never hold the "
                    f"tier from other callers' puts (read fewer keys per Get, or use allow_partial)")
            nbytes += size
        return len(sizes)

    def get_prefix(self, keys: Sequence[bytes], allow_partial: bool = False, restore: bool = False
                   ) -> list[StoredBlock]:
        """Every block :meth:`open_get` would stream, read at once."""
        with self.open_get(keys, allow_partial, restore=restore) as reader:
            return list(reader)

    def delete(self, keys: Sequence[bytes], fingerprint: bytes = b"", caller: str = "") -> int:
        """Remove ``keys`` from every tier; returns how many were stored. Keys not stored are skipped, and
        so are blocks a Get is streaming (leased): they age out as usual. Only a block's writer may delete
        it: if any stored key was put by another caller than ``caller``, ``ForeignBlockError`` naming it and
        nothing is deleted."""
        check_keys(keys, fingerprint)
        self._check_writer(keys, caller)
        pinned = self.leases.pinned()
        deleted = 0
        for key in dict.fromkeys(keys):
            if key in pinned:
                continue
            in_memory, on_disk = key in self.memory, self.disk is not None and key in self.disk
            if in_memory:
                self.memory.remove(key)
            if on_disk:
                self.disk.remove(key)
            deleted += in_memory or on_disk
        self.deleted_total += deleted
        return deleted

    def _check_writer(self, keys: Sequence[bytes], caller: str) -> None:
        for i, key in enumerate(keys):
            record = self._stored(key)
            if record is None or record.writer == caller:
                continue
            self.foreign_deletes_total += 1
            if (caller, record.writer) not in self._logged_foreign:  # once per pair, not per call
                self._logged_foreign.add((caller, record.writer))
                log.warning("Delete of a block another caller put refused", caller=caller, writer=record.writer,
                            key=key.hex())
            raise ForeignBlockError(
                f"keys[{i}] = {key.hex()} was put by another caller: a block may be deleted only by the "
                f"caller that put it (nothing of this Delete was deleted)")

    def _stored(self, key: bytes) -> StoredRecord | None:
        """The digest and writer of ``key`` if stored (a damaged disk-only file is dropped: not stored)."""
        block = self.memory.get(key)
        if block is not None:
            return StoredRecord(block.digest, block.writer)
        if self.disk is None or key not in self.disk:
            return None
        header = self.disk.stored_header(key)
        return StoredRecord(header.digest, header.writer) if header is not None else None

    def staging(self, writer: str = "") -> PutStaging:
        """Where a put by ``writer`` leaves its blocks' files as they arrive (write-through only); pass it
        to :meth:`put` (same writer), and :meth:`PutStaging.discard` it when the put ends either way."""
        return PutStaging(self.disk if self.write_through else None, writer)

    def put(self, blocks: Sequence[StoredBlock], *, verified: bool = False, staging: PutStaging | None = None,
            writer: str = "") -> PutResult:
        """Store ``blocks`` as written by ``writer``, atomically: checksums (unless ``verified``) and room in
        every tier are checked first, and on any error nothing changes (but a damaged disk file found on the
        way is dropped). Keys already stored are refreshed, never replaced (first writer wins; those whose
        stored bytes differ from this put's count in ``kept_existing``)."""
        assert staging is None or staging.writer == writer, "a put's staging names another writer"
        unique: dict[bytes, StoredBlock] = {}
        for block in blocks:
            if not verified:
                block.verify()
            if block.key not in unique:
                unique[block.key] = block.sealed(writer)
        kept = self._count_differing(unique, writer)
        new = [block for key, block in unique.items() if key not in self]
        new_keys = {block.key for block in new}
        pinned = self.leases.pinned()
        keep = pinned | unique.keys()
        victims = self._plan(self.memory, sum(len(b.data) for b in new), unique.keys(),
                             self.leases.pinned_in_memory())
        if self.write_through:
            assert self.disk is not None
            # a key stored in memory only goes to disk with its stored bytes, not this put's
            to_disk = [self.memory.get(key) or block for key, block in unique.items() if key not in self.disk]
            disk_victims = self._plan(self.disk, sum(len(b.data) for b in to_disk), unique.keys(), pinned)
            staged = {key: path for key, path in staging.files.items() if key in new_keys} if staging else None
            try:
                self.disk.write_all(to_disk, disk_victims, staged)
            except OSError as error:
                raise DiskWriteError(f"write-through to {self.disk.directory} failed: {error}") from error
        for key in victims:
            self._spill(self.memory.evict(key), keep)
        for block in new:
            self.memory.add(block)
        keys = list(unique)
        self.memory.touch(keys)
        if self.disk is not None:
            self.disk.touch([key for key in keys if key not in self.memory])
        self.kept_existing_total += kept
        return PutResult(stored=len(new), existing=len(unique) - len(new), kept_existing=kept,
                         evicted=len(victims))

    def _count_differing(self, unique: dict[bytes, StoredBlock], writer: str) -> int:
        """How many of ``unique`` are stored with other bytes (logged once per writer)."""
        differing = []
        for key, block in unique.items():
            record = self._stored(key)
            if record is not None and record.digest != block.digest:
                differing.append(key)
        if differing and writer not in self._logged_kept:
            self._logged_kept.add(writer)
            log.info("a put of stored keys with other bytes keeps the stored blocks (first writer wins; "
                     "kept_existing_total counts them)", writer=writer, key=differing[0].hex(), blocks=len(differing))
        return len(differing)

    def stats(self) -> StoreStats:
        disk = self.disk  # an empty DiskTier is falsy (len 0): test against None
        corrupt = disk.corrupt_total if disk is not None else 0
        return StoreStats(
            blocks=len(self),
            memory_blocks=len(self.memory),
            memory_bytes_total=self.memory.capacity_bytes,
            memory_bytes_used=self.memory.used_bytes,
            disk_blocks=len(disk) if disk is not None else 0,
            disk_bytes_total=disk.capacity_bytes if disk is not None else 0,
            disk_bytes_used=disk.used_bytes if disk is not None else 0,
            hits_total=self.hits_total,
            disk_hits_total=self.disk_hits_total,
            misses_total=self.misses_total,
            restored_blocks_total=self.restored_blocks_total,
            memory_evictions_total=self.memory.evictions_total,
            disk_evictions_total=(disk.evictions_total if disk is not None else 0) + corrupt,
            disk_corrupt_total=corrupt,
            disk_write_failures_total=self.disk_write_failures_total,
            leases=len(self.leases),
            memory_corrupt_total=self.memory.corrupt_total,
            kept_existing_total=self.kept_existing_total,
            foreign_deletes_total=self.foreign_deletes_total,
        )

    def check_integrity(self) -> None:
        self.memory.check_integrity()
        if self.disk is not None:
            self.disk.check_integrity()

    def _stored_prefix(self, keys: Sequence[bytes]) -> int:
        for i, key in enumerate(keys):
            if key not in self:
                return i
        return len(keys)

    def _plan(self, tier: MemoryTier | DiskTier, nbytes: int, own: Collection[bytes], pinned: set[bytes]
              ) -> list[bytes]:
        """Victims that make room for ``nbytes`` in ``tier``, sparing this put's keys and leased blocks;
        ``StoreFullError`` naming what holds the room when there are none."""
        victims = tier.victims(nbytes, pinned | set(own))
        if victims is not None:
            return victims
        name = "memory" if tier is self.memory else "disk"
        held_by_put = tier.capacity_bytes - tier.index.evictable_bytes(own)
        held_by_leases = tier.capacity_bytes - tier.index.evictable_bytes(pinned - set(own))
        reason = f"; {held_by_leases} bytes are held by blocks being read (leased)" if held_by_leases else ""
        raise StoreFullError(
            f"{nbytes} bytes of new blocks do not fit in the {name} tier: capacity {tier.capacity_bytes} "
            f"bytes, {held_by_put} of them held by blocks this put refreshes{reason}"
        )

    def _spill(self, block: StoredBlock, keep: Collection[bytes]) -> None:
        """A block evicted from memory goes to disk, unless it is there already or finds no room."""
        disk = self.disk
        if disk is None or block.key in disk:
            return
        victims = disk.victims(len(block.data), keep)
        if victims is None:
            log.debug("evicted block finds no room on disk, dropped", key=block.key.hex())
            return
        try:
            disk.write_all([block], victims)
        except OSError as error:
            self.disk_write_failures_total += 1
            if not self._disk_failing:  # once per run of failures: a full disk fails every spill
                log.warning("evicted blocks cannot be written to disk: dropped until a write works again "
                            "(disk_write_failures_total counts them)", directory=str(disk.directory),
                            error=str(error))
            self._disk_failing = True
            return
        if self._disk_failing:
            log.info("evicted blocks are written to disk again", failures_total=self.disk_write_failures_total)
            self._disk_failing = False

    def fetch(self, key: bytes, restore: bool = False) -> StoredBlock | None:
        """The block of ``key`` for a reader, its digest checked: from memory, else read from disk (verified)
        and promoted. A memory copy whose bytes changed is dropped (a disk copy may still serve)."""
        block = self.memory.get(key)
        if block is not None and not block.intact():
            log.warning("memory block no longer matches its digest, dropped", key=key.hex())
            self.memory.drop_corrupt(key)
            block = None
        if block is None:
            if self.disk is None or key not in self.disk:
                return None  # gone since the Get began (its lease expired)
            block = self.disk.read(key)
            if block is None:
                return None
            if not restore:
                self.disk_hits_total += 1
            self._promote(block)
        if restore:
            self.restored_blocks_total += 1
        else:
            self.hits_total += 1
        return block

    def _promote(self, block: StoredBlock) -> None:
        pinned = self.leases.pinned()
        victims = self.memory.victims(len(block.data), self.leases.pinned_in_memory() | {block.key})
        if victims is None:
            return  # memory is held by leases: served from disk only
        for key in victims:
            self._spill(self.memory.evict(key), pinned | {block.key})
        self.memory.add(block)

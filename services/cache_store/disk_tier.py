"""The disk tier: one file per block in a directory (:mod:`block_file`), a byte capacity, LRU order.

On open the directory is re-indexed: leftover temp files and unreadable or short block files are deleted,
recency comes from the files' mtimes (a disk hit touches its file), and files past the capacity are
evicted, least recent first. Capacity counts block data bytes, like the memory tier's; each file adds
a header of about a hundred bytes. A file that turns out damaged or missing when read is dropped from
the index (and deleted) and counted in ``corrupt_total``: the store then treats the block as missing. A
file is damaged when its data no longer matches the digest the store took at Put (``block_file``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import structlog

from services.cache_store import block_file
from services.cache_store.block import StoredBlock
from services.cache_store.errors import CorruptBlockError, DiskWriteError
from services.cache_store.lru import LruIndex

log = structlog.get_logger(__name__)


class DiskTier:
    def __init__(self, directory: Path, capacity_bytes: int) -> None:
        self.directory = Path(directory)
        self.index = LruIndex(capacity_bytes)
        self.evictions_total = 0
        self.corrupt_total = 0
        self._last_ns = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_writable()
        self._reindex()

    def _check_writable(self) -> None:
        """A directory that exists but cannot be written would lose every spill, one warning at a time:
        fail at start instead (``OSError`` naming the directory)."""
        probe = self.directory / f".probe-{os.getpid()}.tmp"
        try:
            probe.write_bytes(b"pdserve")
            probe.unlink()
        except OSError as error:
            with contextlib.suppress(OSError):
                probe.unlink()
            raise OSError(f"the disk tier's directory {self.directory} cannot be written: {error}") from error

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: bytes) -> bool:
        return key in self.index

    @property
    def capacity_bytes(self) -> int:
        return self.index.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self.index.used_bytes

    def path(self, key: bytes) -> Path:
        return self.directory / block_file.file_name(key)

    def victims(self, nbytes: int, keep: Collection[bytes]) -> list[bytes] | None:
        return self.index.victims(nbytes, keep)

    def write_all(self, blocks: Sequence[StoredBlock], victims: Sequence[bytes],
                  staged: Mapping[bytes, Path] | None = None) -> None:
        """Write the files of ``blocks`` (renaming those ``staged`` by :meth:`stage`), then evict
        ``victims`` (the room the caller planned) and index the blocks as the most recent, the first most
        of all. On an ``OSError`` nothing changes: the files this call named are deleted."""
        staged = staged or {}
        written: list[bytes] = []
        try:
            for block in blocks:
                assert block.key not in self.index, f"{block.key.hex()} is already on disk"
                if block.key in staged:
                    block_file.commit(staged[block.key], block.key)
                else:
                    block_file.write_block(self.directory, block)
                written.append(block.key)
        except OSError:
            for key in written:
                self._unlink(key)
            raise
        for key in victims:
            self.evict(key)
        for block in reversed(blocks):
            self.index.add(block.key, len(block.data))
            self._stamp(block.key)
        assert self.used_bytes <= self.capacity_bytes, "disk tier over capacity"

    def stage(self, block: StoredBlock) -> Path:
        """Write ``block``'s file under a temporary name, for :meth:`write_all` to commit; a restart
        deletes what was never committed."""
        return block_file.write_temp(self.directory, block)

    def evict(self, key: bytes) -> None:
        self.index.remove(key)
        self.evictions_total += 1
        self._unlink(key)

    def remove(self, key: bytes) -> None:
        """Delete ``key``'s file at its owner's request (not an eviction)."""
        self.index.remove(key)
        self._unlink(key)

    def read(self, key: bytes) -> StoredBlock | None:
        """The verified block, refreshed (index and mtime); None, with the file deleted and counted, when
        the file is damaged or gone."""
        path = self.path(key)
        try:
            block = block_file.read_block(path, key)
        except (CorruptBlockError, OSError) as error:
            self._drop_damaged(key, error)
            return None
        self.touch([key])
        return block

    def stored_header(self, key: bytes) -> block_file.FileHeader | None:
        """The header of ``key``'s file (its digest and writer: a put compares the digest, a delete the
        writer), or None when the file is damaged or gone: it is then dropped, counted as a damaged read
        is. The data itself is verified on its next read."""
        try:
            header = block_file.read_header(self.path(key))
            if header.key != key:
                raise CorruptBlockError(f"{self.path(key).name} holds block {header.key.hex()}")
        except (CorruptBlockError, OSError) as error:
            self._drop_damaged(key, error)
            return None
        return header

    def _drop_damaged(self, key: bytes, error: Exception) -> None:
        log.warning("disk block unreadable, dropped", key=key.hex(), error=str(error))
        self.index.remove(key)
        self.corrupt_total += 1
        self._unlink(key)

    def touch(self, keys: Sequence[bytes]) -> None:
        """Refresh ``keys`` (first most recent) in the index and their files' mtimes."""
        self.index.touch(keys)
        for key in reversed(keys):
            if key in self.index:
                self._stamp(key)

    def _stamp(self, key: bytes) -> None:
        """Set the file's mtime to a strictly increasing clock, so a restart restores the exact order
        (the kernel's own file times are coarse: many writes share one tick)."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        with contextlib.suppress(FileNotFoundError):  # found missing on its next read
            os.utime(self.path(key), ns=(self._last_ns, self._last_ns))

    def keys_lru_first(self) -> list[bytes]:
        return self.index.keys_lru_first()

    def check_integrity(self) -> None:
        """The index matches the directory's block files, and their sizes."""
        on_disk = {key for entry in os.scandir(self.directory) if (key := block_file.key_of(entry.name))}
        assert on_disk == set(self.index), f"disk index and files differ: {len(on_disk)} files, {len(self.index)}"
        for key in self.index:
            size, indexed = block_file.read_header(self.path(key)).data_length, self.index.size_of(key)
            assert size == indexed, f"{key.hex()}: its file holds {size} bytes, the index says {indexed}"
        assert self.used_bytes <= self.capacity_bytes, f"disk used {self.used_bytes} > {self.capacity_bytes}"

    def _unlink(self, key: bytes) -> None:
        try:
            self.path(key).unlink(missing_ok=True)
        except OSError as error:
            log.warning("could not delete a disk block", key=key.hex(), error=str(error))

    def _reindex(self) -> None:
        found: list[tuple[int, str, bytes, int]] = []  # (mtime ns, name, key, data bytes)
        removed = 0
        for entry in os.scandir(self.directory):
            if not entry.is_file(follow_symlinks=False):
                continue
            path = Path(entry.path)
            if entry.name.endswith(block_file.TMP_SUFFIX):
                path.unlink(missing_ok=True)
                removed += 1
                continue
            key = block_file.key_of(entry.name)
            if key is None:
                continue  # not ours: left alone
            try:
                header = block_file.read_header(path)
                if header.key != key or header.data_length == 0:
                    raise CorruptBlockError(f"{entry.name}: holds block {header.key.hex()}")
            except (CorruptBlockError, OSError) as error:
                log.warning("unreadable disk block deleted", file=entry.name, error=str(error))
                path.unlink(missing_ok=True)
                removed += 1
                continue
            found.append((entry.stat().st_mtime_ns, entry.name, key, header.data_length))
        for _, _, key, size in sorted(found):
            self.index.add(key, size)
        self._last_ns = max((mtime for mtime, *_ in found), default=0)
        over = self.index.victims(0, ())
        for key in over or []:
            self.evict(key)
        log.info("disk tier indexed", directory=str(self.directory), blocks=len(self.index),
                 used_bytes=self.used_bytes, evicted=len(over or []), removed=removed)


class PutStaging:
    """The files of a write-through put, written under temporary names as its blocks arrive, so that
    ``put`` only renames them; a put that fails or is cut leaves none (a restart deletes any a kill left).
    The files name ``writer``, the caller of the put."""

    def __init__(self, disk: DiskTier | None, writer: str = "") -> None:  # None: no write-through
        self.disk = disk
        self.writer = writer
        self.files: dict[bytes, Path] = {}

    def add(self, block: StoredBlock) -> None:
        if self.disk is None or block.key in self.files or block.key in self.disk:
            return
        try:
            self.files[block.key] = self.disk.stage(block.sealed(self.writer))
        except OSError as error:
            raise DiskWriteError(f"write-through to {self.disk.directory} failed: {error}") from error

    def discard(self) -> None:
        """Delete the files :meth:`BlockStore.put` did not commit (those it did were renamed away)."""
        for path in self.files.values():
            path.unlink(missing_ok=True)
        self.files.clear()

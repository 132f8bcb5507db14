"""One block per file: ``<key hex>`` in the disk tier's directory, written atomically.

Layout (big-endian)::

    magic "PDKV" | version u16 | key 32 | checksum algorithm u8 | checksum length u8 | checksum 16 (padded)
    | digest 32 | layout length u32 | writer length u16 | data length u64 | layout | writer (utf-8) | data

``digest`` is the store's seal taken at Put (``block.digest_of``), ``writer`` the caller
that put the block (only it may delete the block, after a restart too). A file is written under a ``.tmp``
name and renamed into place (``os.replace``), so a reader, or a restart after a crash, sees a whole file or
none. Data is verified against its digest and its checksum on every read. Files of version 1 (no digest,
no writer) are refused as unreadable: a restart deletes them (the blocks are fetched or recomputed again).
"""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from services.cache_store.block import CHECKSUM_IDS, DIGEST_BYTES, MAX_CHECKSUM_BYTES, StoredBlock
from services.cache_store.errors import CorruptBlockError
from services.cache_store.keys import KEY_BYTES

MAGIC = b"PDKV"
VERSION = 2
HEADER = struct.Struct(f">4sH{KEY_BYTES}sBB{MAX_CHECKSUM_BYTES}s{DIGEST_BYTES}sIHQ")
TMP_SUFFIX = ".tmp"
_ALGORITHMS = {number: name for name, number in CHECKSUM_IDS.items()}
_tmp_ids = itertools.count()


@dataclass(frozen=True)
class FileHeader:
    key: bytes
    checksum_algorithm: str
    checksum: bytes
    digest: bytes
    layout_length: int
    writer_length: int
    data_length: int
    writer: str = ""  # read by read_header; decode_header leaves it empty

    @property
    def file_size(self) -> int:
        return HEADER.size + self.layout_length + self.writer_length + self.data_length


def file_name(key: bytes) -> str:
    return key.hex()


def key_of(name: str) -> bytes | None:
    """The key a file name stands for, or None for a name that is not a block file's."""
    if len(name) != 2 * KEY_BYTES:
        return None
    try:
        return bytes.fromhex(name)
    except ValueError:
        return None


def encode_header(block: StoredBlock, writer: bytes) -> bytes:
    assert len(block.digest) == DIGEST_BYTES, f"block {block.key.hex()} has no digest (BlockStore.put seals it)"
    return HEADER.pack(MAGIC, VERSION, block.key, CHECKSUM_IDS[block.checksum_algorithm], len(block.checksum),
                       block.checksum, block.digest, len(block.layout), len(writer), len(block.data))


def decode_header(raw: bytes) -> FileHeader:
    if len(raw) < HEADER.size:
        raise CorruptBlockError(f"short header: {len(raw)} of {HEADER.size} bytes")
    magic, version, key, algorithm, checksum_length, checksum, digest, layout_length, writer_length, data_length \
        = HEADER.unpack(raw[:HEADER.size])
    if magic != MAGIC:
        raise CorruptBlockError(f"not a block file (magic {magic!r})")
    if version != VERSION:
        raise CorruptBlockError(f"a block file of format version {version}, not {VERSION}")
    if algorithm not in _ALGORITHMS or checksum_length > MAX_CHECKSUM_BYTES:
        raise CorruptBlockError(f"unknown checksum algorithm {algorithm} (length {checksum_length})")
    return FileHeader(key, _ALGORITHMS[algorithm], checksum[:checksum_length], digest, layout_length,
                      writer_length, data_length)


def write_temp(directory: Path, block: StoredBlock) -> Path:
    """Write ``block``'s file under a temporary name (the caller renames it with :func:`commit`); on an
    ``OSError`` nothing is left behind."""
    tmp = directory / f"{file_name(block.key)}.{os.getpid()}.{next(_tmp_ids)}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            writer = block.writer.encode()
            _write_all(fd, encode_header(block, writer) + block.layout + writer)
            _write_all(fd, block.data)
        finally:
            os.close(fd)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def commit(tmp: Path, key: bytes) -> None:
    """Give a file written by :func:`write_temp` its block's name, atomically."""
    os.replace(tmp, tmp.parent / file_name(key))


def write_block(directory: Path, block: StoredBlock) -> None:
    """Write ``block``'s file atomically; on an ``OSError`` no file of this call is left behind."""
    tmp = write_temp(directory, block)
    try:
        commit(tmp, block.key)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_header(path: Path) -> FileHeader:
    """The header of a block file whose size matches it (``CorruptBlockError`` otherwise), with its writer."""
    with open(path, "rb") as file:
        header = decode_header(file.read(HEADER.size))
        size = os.fstat(file.fileno()).st_size
        file.seek(header.layout_length, os.SEEK_CUR)
        writer = file.read(header.writer_length)
    if size != header.file_size:
        raise CorruptBlockError(f"{path.name}: {size} bytes, its header says {header.file_size}")
    return replace(header, writer=_writer_of(writer, path))


def _writer_of(raw: bytes, path: Path) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CorruptBlockError(f"{path.name}: its writer is not UTF-8") from None


def read_block(path: Path, key: bytes) -> StoredBlock:
    """The verified block in ``path``; ``CorruptBlockError`` for a damaged file or another key's,
    ``OSError`` (``FileNotFoundError``) for one that cannot be read."""
    with open(path, "rb", buffering=0) as file:
        header = decode_header(file.read(HEADER.size))
        layout = file.read(header.layout_length)
        writer = file.read(header.writer_length)
        data = file.read(header.data_length)
        trailing = file.read(1)
    if header.key != key:
        raise CorruptBlockError(f"{path.name} holds block {header.key.hex()}")
    if len(layout) != header.layout_length or len(writer) != header.writer_length \
            or len(data) != header.data_length or trailing:
        raise CorruptBlockError(f"{path.name}: length does not match its header")
    block = StoredBlock(key, data, header.checksum_algorithm, header.checksum, layout, header.digest,
                        _writer_of(writer, path))
    if not block.intact():  # also checks the data against its checksum: intact() computes it
        raise CorruptBlockError(f"{path.name}: its data no longer matches the digest taken at Put")
    return block

"""One block per file: ``<key hex>`` in the disk tier's directory, written atomically.

Layout (big-endian)::

    magic "PDKV" | version u16 | key 32 | checksum algorithm u8 | checksum length u8 | checksum 16 (padded)
    | layout length u32 | data length u64 | layout | data

A file is written under a ``.tmp`` name and renamed into place (``os.replace``), so a reader, or a
restart after a crash, sees a whole file or none. Data is verified against its checksum on every read.
"""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from services.cache_store.block import CHECKSUM_IDS, MAX_CHECKSUM_BYTES, StoredBlock
from services.cache_store.errors import CorruptBlockError
from services.cache_store.keys import KEY_BYTES

MAGIC = b"PDKV"
VERSION = 1
HEADER = struct.Struct(f">4sH{KEY_BYTES}sBB{MAX_CHECKSUM_BYTES}sIQ")
TMP_SUFFIX = ".tmp"
_ALGORITHMS = {number: name for name, number in CHECKSUM_IDS.items()}
_tmp_ids = itertools.count()


@dataclass(frozen=True)
class FileHeader:
    key: bytes
    checksum_algorithm: str
    checksum: bytes
    layout_length: int
    data_length: int

    @property
    def file_size(self) -> int:
        return HEADER.size + self.layout_length + self.data_length


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


def encode_header(block: StoredBlock) -> bytes:
    return HEADER.pack(MAGIC, VERSION, block.key, CHECKSUM_IDS[block.checksum_algorithm], len(block.checksum),
                       block.checksum, len(block.layout), len(block.data))


def decode_header(raw: bytes) -> FileHeader:
    if len(raw) < HEADER.size:
        raise CorruptBlockError(f"short header: {len(raw)} of {HEADER.size} bytes")
    magic, version, key, algorithm, checksum_length, checksum, layout_length, data_length = HEADER.unpack(
        raw[:HEADER.size])
    if magic != MAGIC or version != VERSION:
        raise CorruptBlockError(f"not a block file (magic {magic!r}, version {version})")
    if algorithm not in _ALGORITHMS or checksum_length > MAX_CHECKSUM_BYTES:
        raise CorruptBlockError(f"unknown checksum algorithm {algorithm} (length {checksum_length})")
    return FileHeader(key, _ALGORITHMS[algorithm], checksum[:checksum_length], layout_length, data_length)


def write_temp(directory: Path, block: StoredBlock) -> Path:
    """Write ``block``'s file under a temporary name (the caller renames it with :func:`commit`); on an
    ``OSError`` nothing is left behind."""
    tmp = directory / f"{file_name(block.key)}.{os.getpid()}.{next(_tmp_ids)}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, encode_header(block) + block.layout)
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
    """The header of a block file whose size matches it (``CorruptBlockError`` otherwise)."""
    with open(path, "rb") as file:
        header = decode_header(file.read(HEADER.size))
        size = os.fstat(file.fileno()).st_size
    if size != header.file_size:
        raise CorruptBlockError(f"{path.name}: {size} bytes, its header says {header.file_size}")
    return header


def read_block(path: Path, key: bytes) -> StoredBlock:
    """The verified block in ``path``; ``CorruptBlockError`` for a damaged file or another key's,
    ``OSError`` (``FileNotFoundError``) for one that cannot be read."""
    with open(path, "rb", buffering=0) as file:
        header = decode_header(file.read(HEADER.size))
        layout = file.read(header.layout_length)
        data = file.read(header.data_length)
        trailing = file.read(1)
    if header.key != key:
        raise CorruptBlockError(f"{path.name} holds block {header.key.hex()}")
    if len(layout) != header.layout_length or len(data) != header.data_length or trailing:
        raise CorruptBlockError(f"{path.name}: length does not match its header")
    block = StoredBlock(key, data, header.checksum_algorithm, header.checksum, layout)
    block.verify()
    return block

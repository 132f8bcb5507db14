"""Shared by the cache-store tests: readable 32-byte keys, blocks, layouts and put streams."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence

from pdserve.v1 import cache_store_pb2, node_pb2

from services.cache_store.block import StoredBlock, checksum
from services.cache_store.keys import store_key

FP = b"model-A".ljust(16, b"\0")
OTHER_FP = b"model-B".ljust(16, b"\0")
CRC32 = cache_store_pb2.CHECKSUM_ALGORITHM_CRC32


def layout(fingerprint: bytes = FP, bytes_per_block: int = 0) -> node_pb2.KVLayout:
    return node_pb2.KVLayout(dtype="bfloat16", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64,
                             model_fingerprint=fingerprint, bytes_per_block=bytes_per_block)


LAYOUT_BYTES = layout().SerializeToString()
END = cache_store_pb2.PutChunk(end_of_put=True)
"""The chunk that ends a put."""


def key(name: str, fingerprint: bytes = FP) -> bytes:
    """``name`` as a block id: readable in failures, 32 bytes with the fingerprint."""
    return store_key(fingerprint, name.encode().ljust(16, b"."))


def keys(*names: str) -> list[bytes]:
    return [key(name) for name in names]


def names(stored: Sequence[bytes]) -> list[str]:
    return [k[16:].rstrip(b".").decode() for k in stored]


def block(name: str, size: int = 10, algorithm: str = "crc32") -> StoredBlock:
    data = (name.encode() * size)[:size]
    return StoredBlock(key(name), data, algorithm, checksum(algorithm, data), LAYOUT_BYTES)


def blocks(*names: str, size: int = 10) -> list[StoredBlock]:
    return [block(name, size) for name in names]


def crc(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def put_stream(pairs: Sequence[tuple[bytes, bytes]], chunk_bytes: int = 1 << 20, corrupt: bytes = b"",
               truncate: bytes = b"", kv_layout: node_pb2.KVLayout | None = None, end: bool = True
               ) -> Iterator[cache_store_pb2.PutChunk]:
    """A put stream; the block keyed ``corrupt`` gets a wrong checksum, ``truncate`` loses its last byte;
    ``end``: the chunk that ends the put comes last (without it nothing is stored)."""
    for k, data in pairs:
        checksum_ = crc(data + b"!") if k == corrupt else crc(data)
        sent = data[:-1] if k == truncate else data
        pieces = [sent[i : i + chunk_bytes] for i in range(0, len(sent), chunk_bytes)] or [b""]
        yield cache_store_pb2.PutChunk(key=k, total_length=len(data), checksum_algorithm=CRC32,
                                       checksum=checksum_, layout=kv_layout or layout(), data=pieces[0])
        for piece in pieces[1:]:
            yield cache_store_pb2.PutChunk(data=piece)
    if end:
        yield END

"""The cache-store's message framing, for its clients: blocks → ``PutChunk``s, ``GetChunk``s → blocks.

A block travels as consecutive chunks of at most ``CHUNK_BYTES`` of data, the first carrying its header
(key, length, checksum, layout). Checksums are crc32 (``zlib``), verified on arrival.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence

from pdserve.v1 import cache_store_pb2, node_pb2

from services.cache_store.errors import CorruptBlockError

CHUNK_BYTES = 2 << 20
CRC32 = cache_store_pb2.CHECKSUM_ALGORITHM_CRC32
Block = tuple[bytes, "bytes | memoryview"]
"""``(key, data)``."""


def crc32(data: bytes | memoryview) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def put_chunks(blocks: Sequence[Block], layout: node_pb2.KVLayout | None,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[cache_store_pb2.PutChunk]:
    for key, data in blocks:
        view = memoryview(data)
        yield cache_store_pb2.PutChunk(key=key, total_length=len(view), checksum_algorithm=CRC32,
                                       checksum=crc32(view), layout=layout, data=bytes(view[:chunk_bytes]))
        for start in range(chunk_bytes, len(view), chunk_bytes):
            yield cache_store_pb2.PutChunk(data=bytes(view[start:start + chunk_bytes]))


class BlockAssembler:
    """Feed ``GetChunk``s in order; whole, verified blocks come out of :meth:`add` and :meth:`finish`."""

    def __init__(self) -> None:
        self._header: cache_store_pb2.GetChunk | None = None
        self._parts: list[bytes] = []

    def add(self, chunk: cache_store_pb2.GetChunk) -> tuple[bytes, bytes] | None:
        done = None
        if chunk.key:
            done = self._close()
            self._header, self._parts = chunk, []
        elif self._header is None:
            raise CorruptBlockError("cache-store sent data before a block header")
        self._parts.append(chunk.data)
        return done

    def finish(self) -> tuple[bytes, bytes] | None:
        return self._close()

    def _close(self) -> tuple[bytes, bytes] | None:
        header, self._header = self._header, None
        if header is None:
            return None
        data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        if len(data) != header.total_length or (header.checksum_algorithm == CRC32 and crc32(data) != header.checksum):
            raise CorruptBlockError(f"block {header.key.hex()} arrived damaged from the cache-store")
        return header.key, data

"""A blocking client of the cache-store for callers on a worker thread (the engine's KV offload).

``put`` streams blocks as ``PutChunk``s (1 MiB of data per chunk, crc32 checksums); ``get`` reassembles
the ``GetChunk`` stream and verifies every checksum. gRPC errors propagate as ``grpc.RpcError``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence

import grpc
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc

from services.cache_store.errors import CorruptBlockError

CHUNK_BYTES = 1 << 20
_CRC32 = cache_store_pb2.CHECKSUM_ALGORITHM_CRC32


def _crc(data: bytes | memoryview) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


class CacheStoreClient:
    def __init__(self, address: str, timeout_s: float = 30.0):
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
        self._stub = cache_store_pb2_grpc.CacheStoreStub(self._channel)

    def put(self, blocks: Sequence[tuple[bytes, bytes | memoryview]]) -> cache_store_pb2.PutResponse:
        """Store ``(key, data)`` pairs atomically."""
        return self._stub.Put(self._chunks(blocks), timeout=self.timeout_s)

    @staticmethod
    def _chunks(blocks: Sequence[tuple[bytes, bytes | memoryview]]) -> Iterator[cache_store_pb2.PutChunk]:
        for key, data in blocks:
            view = memoryview(data)
            first = bytes(view[:CHUNK_BYTES])
            yield cache_store_pb2.PutChunk(key=key, total_length=len(view), checksum_algorithm=_CRC32,
                                           checksum=_crc(view), data=first)
            for start in range(CHUNK_BYTES, len(view), CHUNK_BYTES):
                yield cache_store_pb2.PutChunk(data=bytes(view[start:start + CHUNK_BYTES]))

    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        """The data of ``keys`` in order (``NOT_FOUND`` if any is missing)."""
        blocks: list[bytes] = []
        parts: list[bytes] = []
        header: cache_store_pb2.GetChunk | None = None
        for chunk in self._stub.Get(cache_store_pb2.GetRequest(keys=list(keys)), timeout=self.timeout_s):
            if chunk.key:
                if header is not None:
                    blocks.append(self._finish(header, parts))
                header, parts = chunk, []
            parts.append(chunk.data)
        if header is not None:
            blocks.append(self._finish(header, parts))
        return blocks

    @staticmethod
    def _finish(header: cache_store_pb2.GetChunk, parts: list[bytes]) -> bytes:
        data = b"".join(parts)
        if len(data) != header.total_length or (header.checksum_algorithm == _CRC32 and _crc(data) != header.checksum):
            raise CorruptBlockError(f"block {header.key.hex()} arrived damaged from the cache-store")
        return data

    def close(self) -> None:
        self._channel.close()

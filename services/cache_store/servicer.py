"""``pdserve.v1.CacheStore`` over a ``BlockStore``: decode the proto, call the store, encode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import grpc
import grpc.aio
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, gateway_pb2, node_pb2

from services.cache_store.assembly import BlockHeader, PutAssembler, split
from services.cache_store.errors import (
    CorruptBlockError,
    MalformedPutError,
    MissingBlockError,
    StoreFullError,
)
from services.cache_store.store import BlockStore, StoredBlock
from services.common.errors import UnavailableError, grpc_errors, map_error

map_error(MalformedPutError, grpc.StatusCode.INVALID_ARGUMENT)
map_error(CorruptBlockError, grpc.StatusCode.DATA_LOSS)
map_error(StoreFullError, grpc.StatusCode.RESOURCE_EXHAUSTED)
map_error(MissingBlockError, grpc.StatusCode.NOT_FOUND)

Algorithm = cache_store_pb2.ChecksumAlgorithm
_ALGORITHMS = {
    Algorithm.CHECKSUM_ALGORITHM_CRC32: "crc32",
    Algorithm.CHECKSUM_ALGORITHM_BLAKE2B_128: "blake2b-128",
}
_ALGORITHM_IDS = {name: number for number, name in _ALGORITHMS.items()}


def _header_of(chunk: cache_store_pb2.PutChunk) -> BlockHeader | None:
    if not chunk.key:
        if chunk.total_length or chunk.checksum or chunk.checksum_algorithm or chunk.HasField("layout"):
            raise MalformedPutError("key", "header fields on a chunk without a key")
        return None
    return BlockHeader(
        key=chunk.key,
        total_length=chunk.total_length,
        checksum_algorithm=_ALGORITHMS.get(chunk.checksum_algorithm, "unspecified"),
        checksum=chunk.checksum,
        layout=chunk.layout.SerializeToString() if chunk.HasField("layout") else b"",
    )


def _chunks_of(block: StoredBlock, chunk_bytes: int) -> Iterator[cache_store_pb2.GetChunk]:
    for i, piece in enumerate(split(block.data, chunk_bytes)):
        if i:
            yield cache_store_pb2.GetChunk(data=piece)
            continue
        yield cache_store_pb2.GetChunk(
            key=block.key,
            total_length=len(block.data),
            checksum_algorithm=_ALGORITHM_IDS[block.checksum_algorithm],
            checksum=block.checksum,
            layout=node_pb2.KVLayout.FromString(block.layout) if block.layout else None,
            data=piece,
        )


class CacheStoreServicer(cache_store_pb2_grpc.CacheStoreServicer):
    def __init__(self, store: BlockStore, chunk_bytes: int) -> None:
        self.store = store
        self.chunk_bytes = chunk_bytes
        self.address = ""  # set once the server is bound
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Puts and gets running now."""
        return self._in_flight

    @contextmanager
    def _work(self) -> Iterator[None]:
        """Count a Put/Get as in flight; refused once draining."""
        if self.draining:
            raise UnavailableError("cache-store is draining")
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def drain(self) -> None:
        """Refuse new puts and gets, wait for those in flight."""
        self.draining = True
        await self._idle.wait()

    @grpc_errors
    async def Put(
        self, request_iterator: AsyncIterator[cache_store_pb2.PutChunk], context: grpc.aio.ServicerContext
    ) -> cache_store_pb2.PutResponse:
        """Store the stream's blocks, all or none (see cache_store.proto)."""
        with self._work():
            assembler = PutAssembler(max_bytes=self.store.capacity_bytes)
            async for chunk in request_iterator:
                assembler.add(_header_of(chunk), chunk.data)
            result = self.store.put(assembler.finish())
        return cache_store_pb2.PutResponse(num_stored=result.stored, num_existing=result.existing,
                                           num_evicted=result.evicted)

    @grpc_errors
    async def Get(
        self, request: cache_store_pb2.GetRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cache_store_pb2.GetChunk]:
        """Stream the blocks of ``keys`` (or their longest stored prefix with ``allow_partial``)."""
        with self._work():
            for block in self.store.get_prefix(list(request.keys), request.allow_partial):
                for chunk in _chunks_of(block, self.chunk_bytes):
                    yield chunk

    @grpc_errors
    async def Lookup(
        self, request: cache_store_pb2.LookupRequest, context: grpc.aio.ServicerContext
    ) -> cache_store_pb2.LookupResponse:
        return cache_store_pb2.LookupResponse(num_prefix_hits=self.store.lookup(list(request.keys)))

    @grpc_errors
    async def NodeStatus(
        self, request: node_pb2.NodeStatusRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.NodeStatus:
        """Capacity is in bytes; every stored block counts as cached (evictable)."""
        store = self.store
        return gateway_pb2.NodeStatus(
            address=self.address,
            role="cache_store",
            healthy=not self.draining,
            blocks_total=len(store),
            blocks_cached=len(store),
            bytes_total=store.capacity_bytes,
            bytes_used=store.used_bytes,
            evictions_total=store.evictions_total,
            prefix_hit_blocks_total=store.hit_blocks_total,
            requests_running=self.in_flight,
        )

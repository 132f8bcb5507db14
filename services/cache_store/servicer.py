"""``pdserve.v1.CacheStore`` over a ``BlockStore``: decode the proto, call the store, encode.

:func:`add_to_server` registers it with Put and Get moving pre-serialized chunks
(:mod:`services.cache_store.wire`: no protobuf copies of block data); the generated
``add_CacheStoreServicer_to_server`` works too, with protobuf messages throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import grpc
import grpc.aio
from google.protobuf.message import DecodeError
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, gateway_pb2, node_pb2

from services.cache_store.assembly import BlockHeader, PutAssembler, split
from services.cache_store.block import Layout, StoredBlock
from services.cache_store.errors import (
    CorruptBlockError,
    DiskWriteError,
    ForeignBlockError,
    InvalidKeyError,
    MalformedPutError,
    MissingBlockError,
    StoreFullError,
)
from services.cache_store.keys import check_key_count
from services.cache_store.store import BlockStore
from services.cache_store.wire import PUT_END_METADATA, PutFrame, encode_chunk, parse_put_frame
from services.common.errors import UnavailableError, grpc_errors, map_error
from services.common.tls.roles import caller_name as caller_of
from services.common.tracing import traced_rpc

map_error(MalformedPutError, grpc.StatusCode.INVALID_ARGUMENT)
map_error(InvalidKeyError, grpc.StatusCode.INVALID_ARGUMENT)
map_error(DiskWriteError, grpc.StatusCode.UNAVAILABLE)
map_error(CorruptBlockError, grpc.StatusCode.DATA_LOSS)
map_error(StoreFullError, grpc.StatusCode.RESOURCE_EXHAUSTED)
map_error(MissingBlockError, grpc.StatusCode.NOT_FOUND)
map_error(ForeignBlockError, grpc.StatusCode.PERMISSION_DENIED)

SERVICE = "pdserve.v1.CacheStore"
Algorithm = cache_store_pb2.ChecksumAlgorithm
_ALGORITHMS = {
    Algorithm.CHECKSUM_ALGORITHM_CRC32: "crc32",
    Algorithm.CHECKSUM_ALGORITHM_BLAKE2B_128: "blake2b-128",
}
_ALGORITHM_IDS = {name: number for number, name in _ALGORITHMS.items()}


def _ends_explicitly(context: grpc.aio.ServicerContext) -> bool:
    """Whether the put's client said it ends its puts with ``end_of_put`` (wire.PUT_END_METADATA)."""
    return PUT_END_METADATA in tuple(context.invocation_metadata() or ())


def _header_of(chunk: cache_store_pb2.PutChunk) -> BlockHeader | None:
    if not chunk.key:
        if chunk.total_length or chunk.checksum or chunk.checksum_algorithm or chunk.HasField("layout"):
            raise MalformedPutError("key", "header fields on a chunk without a key")
        return None
    return BlockHeader(
        key=chunk.key,
        total_length=chunk.total_length,
        checksum_algorithm=_ALGORITHMS.get(chunk.checksum_algorithm, "unspecified" if not chunk.checksum_algorithm
                                           else f"enum value {chunk.checksum_algorithm}"),
        checksum=chunk.checksum,
        layout=_layout_of(chunk.layout) if chunk.HasField("layout") else None,
    )


def _layout_of(layout: node_pb2.KVLayout) -> Layout:
    return Layout(layout.SerializeToString(), layout.model_fingerprint, layout.bytes_per_block)


def _header_message(block: StoredBlock) -> cache_store_pb2.GetChunk:
    return cache_store_pb2.GetChunk(
        key=block.key,
        total_length=len(block.data),
        checksum_algorithm=_ALGORITHM_IDS[block.checksum_algorithm],
        checksum=block.checksum,
        layout=node_pb2.KVLayout.FromString(block.layout) if block.layout else None,
    )


def _chunks_of(block: StoredBlock, chunk_bytes: int) -> Iterator[cache_store_pb2.GetChunk]:
    for i, piece in enumerate(split(block.data, chunk_bytes)):
        chunk = cache_store_pb2.GetChunk() if i else _header_message(block)
        chunk.data = bytes(piece)
        yield chunk


def _frames_of(block: StoredBlock, chunk_bytes: int) -> Iterator[bytes]:
    """Serialized ``GetChunk``s of ``block``: one copy of its data."""
    header = _header_message(block).SerializeToString()
    for i, piece in enumerate(split(block.data, chunk_bytes)):
        yield encode_chunk(b"" if i else header, piece)


def _keys_of(request: cache_store_pb2.GetRequest | cache_store_pb2.LookupRequest | cache_store_pb2.DeleteRequest
             ) -> list[bytes]:
    check_key_count(len(request.keys))  # before a million of them are copied out of the message
    return list(request.keys)


class CacheStoreServicer(cache_store_pb2_grpc.CacheStoreServicer):
    def __init__(self, store: BlockStore, chunk_bytes: int) -> None:
        self.store = store
        self.chunk_bytes = chunk_bytes
        self.address = ""  # set once the server is bound
        self.metrics_url = ""  # likewise
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
    @traced_rpc("Put")
    async def Put(
        self, request_iterator: AsyncIterator[cache_store_pb2.PutChunk], context: grpc.aio.ServicerContext
    ) -> cache_store_pb2.PutResponse:
        """Store the stream's blocks, all or none (see cache_store.proto)."""
        with self._work():
            writer = caller_of(context)
            staging = self.store.staging(writer)
            # staged bytes count against the store's budget of unfinished puts (all callers', and this one's)
            assembler = PutAssembler(max_bytes=self.store.capacity_bytes, on_block=staging.add,
                                     budget=self.store.put_budget, caller=writer)
            try:
                ended = False
                try:
                    async for chunk in request_iterator:
                        message, data = chunk if isinstance(chunk, PutFrame) else (chunk, chunk.data)
                        if ended:
                            raise MalformedPutError("end_of_put", "a chunk after the one that ended the put")
                        assembler.add(_header_of(message), data)
                        ended = message.end_of_put
                except DecodeError as error:  # a frame whose header is not a PutChunk
                    raise MalformedPutError("request", f"a message of the stream is not a valid PutChunk "
                                                        f"frame ({error})") from None
                if not ended and _ends_explicitly(context):  # a client cancelling between blocks reaches us
                    # as an ordinary end of stream
                    raise MalformedPutError("end_of_put", "the stream ended without a chunk that sets it: a cut "
                                                          "put stores nothing")
                result = self.store.put(assembler.finish(), verified=True, staging=staging, writer=writer)
            finally:
                assembler.release()  # stored (now counted in the memory tier), refused, failed or cancelled
                staging.discard()
        return cache_store_pb2.PutResponse(num_stored=result.stored, num_existing=result.existing,
                                           num_evicted=result.evicted, num_kept_existing=result.kept_existing)

    @grpc_errors
    @traced_rpc("Get")
    async def Get(
        self, request: cache_store_pb2.GetRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cache_store_pb2.GetChunk]:
        """Stream the blocks of ``keys`` (or their longest stored prefix with ``allow_partial``)."""
        stream = self._stream(request, _chunks_of, caller_of(context))
        async with contextlib.aclosing(stream) as chunks:  # the lease ends with the call
            async for chunk in chunks:
                yield chunk

    @grpc_errors
    @traced_rpc("Get")
    async def get_frames(self, request: cache_store_pb2.GetRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[bytes]:
        """:meth:`Get`, its chunks serialized here (:func:`add_to_server`)."""
        stream = self._stream(request, _frames_of, caller_of(context))
        async with contextlib.aclosing(stream) as frames:  # the lease ends with the call
            async for frame in frames:
                yield frame

    async def _stream(self, request: cache_store_pb2.GetRequest,
                      encode: Callable[[StoredBlock, int], Iterator[object]], caller: str) -> AsyncIterator[object]:
        keys = _keys_of(request)
        with self._work(), self.store.open_get(keys, request.allow_partial, request.model_fingerprint,
                                               request.restore, caller=caller) as reader:
            for block in reader:
                for chunk in encode(block, self.chunk_bytes):
                    yield chunk

    @grpc_errors
    @traced_rpc("Lookup")
    async def Lookup(
        self, request: cache_store_pb2.LookupRequest, context: grpc.aio.ServicerContext
    ) -> cache_store_pb2.LookupResponse:
        hits = self.store.lookup(_keys_of(request), request.model_fingerprint)
        return cache_store_pb2.LookupResponse(num_prefix_hits=hits)

    @grpc_errors
    @traced_rpc("Delete")
    async def Delete(
        self, request: cache_store_pb2.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> cache_store_pb2.DeleteResponse:
        """Only blocks the caller put (see cache_store.proto); PERMISSION_DENIED deletes nothing."""
        deleted = self.store.delete(_keys_of(request), request.model_fingerprint, caller=caller_of(context))
        return cache_store_pb2.DeleteResponse(deleted=deleted)

    @grpc_errors
    async def NodeStatus(
        self, request: node_pb2.NodeStatusRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.NodeStatus:
        """Capacity is in bytes (``bytes_*`` = the memory tier); every stored block counts as cached."""
        return self.status()

    def status(self) -> gateway_pb2.NodeStatus:
        """What ``NodeStatus`` answers (also read by ``/metrics``; on the event loop)."""
        stats = self.store.stats()
        return gateway_pb2.NodeStatus(
            address=self.address,
            metrics_url=self.metrics_url,
            role="cache_store",
            healthy=not self.draining,
            blocks_total=stats.blocks,
            blocks_cached=stats.blocks,
            bytes_total=stats.memory_bytes_total,
            bytes_used=stats.memory_bytes_used,
            evictions_total=stats.memory_evictions_total + stats.disk_evictions_total,
            prefix_hit_blocks_total=stats.hits_total,
            requests_running=self.in_flight,
            memory_blocks=stats.memory_blocks,
            disk_bytes_total=stats.disk_bytes_total,
            disk_bytes_used=stats.disk_bytes_used,
            disk_blocks=stats.disk_blocks,
            hits_total=stats.hits_total,
            disk_hits_total=stats.disk_hits_total,
            misses_total=stats.misses_total,
            restored_blocks_total=stats.restored_blocks_total,
            disk_write_failures_total=stats.disk_write_failures_total,
            memory_evictions_total=stats.memory_evictions_total,
            disk_evictions_total=stats.disk_evictions_total,
        )


def add_to_server(servicer: CacheStoreServicer, server: grpc.aio.Server) -> None:
    """The generated ``add_CacheStoreServicer_to_server``, except that Put and Get move serialized chunks
    (:mod:`services.cache_store.wire`)."""
    pb = cache_store_pb2
    handlers = {
        "Put": grpc.stream_unary_rpc_method_handler(servicer.Put, request_deserializer=parse_put_frame,
                                                    response_serializer=pb.PutResponse.SerializeToString),
        "Get": grpc.unary_stream_rpc_method_handler(servicer.get_frames, request_deserializer=pb.GetRequest.FromString,
                                                    response_serializer=None),
        "Lookup": grpc.unary_unary_rpc_method_handler(servicer.Lookup, request_deserializer=pb.LookupRequest.FromString,
                                                      response_serializer=pb.LookupResponse.SerializeToString),
        "Delete": grpc.unary_unary_rpc_method_handler(servicer.Delete, request_deserializer=pb.DeleteRequest.FromString,
                                                      response_serializer=pb.DeleteResponse.SerializeToString),
        "NodeStatus": grpc.unary_unary_rpc_method_handler(
            servicer.NodeStatus, request_deserializer=node_pb2.NodeStatusRequest.FromString,
            response_serializer=gateway_pb2.NodeStatus.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)

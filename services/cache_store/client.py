"""Clients of the cache-store: blocking (:class:`CacheStoreClient`, for worker threads such as the
engine's KV offload) and asyncio (:class:`AsyncCacheStoreClient`, for the nodes' event loops).

Both put ``(key, data)`` blocks atomically with the node's ``KVLayout`` in every header, get blocks back
verified, and look up the longest stored prefix of a key list. gRPC errors propagate as
``grpc.RpcError`` / ``grpc.aio.AioRpcError``. Put and Get move their chunks pre-serialized
(:mod:`services.cache_store.wire`), saving protobuf's copies of the data. Every call carries the
current trace context (``tracing.outgoing``), so the store's spans join the caller's trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, node_pb2

from services.cache_store.wire import Block, BlockAssembler, parse_get_frame, put_frames, put_metadata
from services.common import tracing
from services.common.server import grpc_options
from services.common.tls.channels import identity_generation, open_channel, open_sync_channel

_PUT = "/pdserve.v1.CacheStore/Put"
_GET = "/pdserve.v1.CacheStore/Get"
_CLOSING: set[asyncio.Task[None]] = set()  # channels replaced after a certificate rotation, being closed


@dataclass(frozen=True)
class _Calls:
    """A channel to the store and the calls made on it (opened again when this process's certificate is
    rotated: ``tls.channels.identity_generation``)."""

    channel: Any
    stub: Any
    put: Any
    get: Any
    generation: int

    @classmethod
    def open(cls, address: str, aio: bool) -> _Calls:
        generation = identity_generation()
        channel = (open_channel if aio else open_sync_channel)(address, "cache-store", grpc_options())
        put = channel.stream_unary(_PUT, request_serializer=None,
                                   response_deserializer=cache_store_pb2.PutResponse.FromString)
        get = channel.unary_stream(_GET, request_serializer=cache_store_pb2.GetRequest.SerializeToString,
                                   response_deserializer=parse_get_frame)
        return cls(channel, cache_store_pb2_grpc.CacheStoreStub(channel), put, get, generation)

    @property
    def stale(self) -> bool:
        return self.generation != identity_generation()


def _get_request(keys: Sequence[bytes], allow_partial: bool, layout: node_pb2.KVLayout | None,
                 restore: bool = False) -> cache_store_pb2.GetRequest:
    fingerprint = layout.model_fingerprint if layout is not None else b""
    return cache_store_pb2.GetRequest(keys=list(keys), allow_partial=allow_partial, model_fingerprint=fingerprint,
                                      restore=restore)


def _lookup_request(keys: Sequence[bytes], layout: node_pb2.KVLayout | None) -> cache_store_pb2.LookupRequest:
    fingerprint = layout.model_fingerprint if layout is not None else b""
    return cache_store_pb2.LookupRequest(keys=list(keys), model_fingerprint=fingerprint)


class CacheStoreClient:
    def __init__(self, address: str, layout: node_pb2.KVLayout | None = None, timeout_s: float = 30.0):
        self.address = address
        self.layout = layout
        self.timeout_s = timeout_s
        self._open = _Calls.open(address, aio=False)

    def _calls(self) -> _Calls:
        if self._open.stale:  # calls of this client are sequential (one worker thread): none in flight
            old, self._open = self._open, _Calls.open(self.address, aio=False)
            old.channel.close()
        return self._open

    def put(self, blocks: Sequence[Block]) -> cache_store_pb2.PutResponse:
        """Store ``(key, data)`` pairs atomically."""
        return self._calls().put(put_frames(blocks, self.layout), timeout=self.timeout_s,
                                 metadata=put_metadata(tracing.outgoing()))

    def get(self, keys: Sequence[bytes], allow_partial: bool = False, restore: bool = False) -> list[bytes]:
        """The data of ``keys`` in order (``NOT_FOUND`` if any is missing, unless ``allow_partial``:
        then the longest stored prefix). ``restore``: a request's own KV read back, not a prefix (the
        store counts it apart from its hits)."""
        assembler, blocks = BlockAssembler(), []
        request = _get_request(keys, allow_partial, self.layout, restore)
        for frame in self._calls().get(request, timeout=self.timeout_s, metadata=tracing.outgoing()):
            if (block := assembler.add(frame)) is not None:
                blocks.append(block[1])
        if (block := assembler.finish()) is not None:
            blocks.append(block[1])
        return blocks

    def lookup(self, keys: Sequence[bytes]) -> int:
        request = _lookup_request(keys, self.layout)
        return self._calls().stub.Lookup(request, timeout=self.timeout_s, metadata=tracing.outgoing()).num_prefix_hits

    def delete(self, keys: Sequence[bytes]) -> int:
        """Remove ``keys`` from the store; how many it held."""
        fingerprint = self.layout.model_fingerprint if self.layout is not None else b""
        request = cache_store_pb2.DeleteRequest(keys=list(keys), model_fingerprint=fingerprint)
        return self._calls().stub.Delete(request, timeout=self.timeout_s, metadata=tracing.outgoing()).deleted

    def close(self) -> None:
        self._open.channel.close()


class AsyncCacheStoreClient:
    def __init__(self, address: str, layout: node_pb2.KVLayout | None = None, timeout_s: float = 30.0):
        self.address = address
        self.layout = layout
        self.timeout_s = timeout_s
        self._open = _Calls.open(address, aio=True)

    def _calls(self) -> _Calls:
        if self._open.stale:  # calls in flight finish on the old channel, closed once they are done
            old, self._open = self._open, _Calls.open(self.address, aio=True)
            task = asyncio.get_running_loop().create_task(old.channel.close(grace=self.timeout_s))
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)
        return self._open

    async def put(self, blocks: Sequence[Block]) -> cache_store_pb2.PutResponse:
        frames = put_frames(blocks, self.layout)
        return await self._calls().put(frames, timeout=self.timeout_s, metadata=put_metadata(tracing.outgoing()))

    async def get(self, keys: Sequence[bytes], allow_partial: bool = False, restore: bool = False) -> list[bytes]:
        assembler, blocks = BlockAssembler(), []
        request = _get_request(keys, allow_partial, self.layout, restore)
        async for frame in self._calls().get(request, timeout=self.timeout_s, metadata=tracing.outgoing()):
            if (block := assembler.add(frame)) is not None:
                blocks.append(block[1])
        if (block := assembler.finish()) is not None:
            blocks.append(block[1])
        return blocks

    async def lookup(self, keys: Sequence[bytes]) -> int:
        request = _lookup_request(keys, self.layout)
        reply = await self._calls().stub.Lookup(request, timeout=self.timeout_s, metadata=tracing.outgoing())
        return reply.num_prefix_hits

    async def close(self) -> None:
        await self._open.channel.close()

"""Draining the cache-store: new puts are refused, the one in flight completes, then the server stops."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, node_pb2

from services.cache_store.servicer import CacheStoreServicer
from services.cache_store.store import BlockStore
from services.common.server import NodeServer, ServiceBinding
from services.common.tls.channels import open_channel
from tests.cache_store.helpers import CRC32, crc, key, layout


def header(key: bytes, data: bytes) -> cache_store_pb2.PutChunk:
    return cache_store_pb2.PutChunk(key=key, total_length=len(data), checksum=crc(data), checksum_algorithm=CRC32,
                                    layout=layout())


async def test_drain_refuses_new_work_and_finishes_in_flight():
    servicer = CacheStoreServicer(BlockStore(1 << 20), chunk_bytes=1 << 16)
    binding = ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer,
                             cache_store_pb2_grpc.add_CacheStoreServicer_to_server)
    server = NodeServer([binding], listen="127.0.0.1:0", drain=servicer.drain, grace_s=2)
    await server.start()
    servicer.address = server.address
    release = asyncio.Event()
    data = b"kv" * 1000

    async def slow_put():
        yield header(key("slow"), data)
        await release.wait()
        yield cache_store_pb2.PutChunk(data=data, end_of_put=True)

    async with open_channel(server.address, "cache-store") as channel:
        stub = cache_store_pb2_grpc.CacheStoreStub(channel)
        in_flight = asyncio.ensure_future(stub.Put(slow_put()))
        while servicer.in_flight == 0:
            await asyncio.sleep(0.01)
        shutdown = asyncio.ensure_future(server.shutdown())
        while not servicer.draining:
            await asyncio.sleep(0.01)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Put(iter([header(key("new"), b"x"), cache_store_pb2.PutChunk(data=b"x", end_of_put=True)]))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        status = await stub.NodeStatus(node_pb2.NodeStatusRequest())
        assert not status.healthy and status.requests_running == 1
        assert not shutdown.done()

        release.set()
        assert (await in_flight).num_stored == 1
        await asyncio.wait_for(shutdown, 5)
    assert key("slow") in servicer.store and key("new") not in servicer.store

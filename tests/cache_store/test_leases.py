"""Leases: eviction never removes a block being read, in either tier; a put that cannot make room
because of them is refused; a lease expires ``lease_s`` after its Get began, and a cancelled Get
releases its lease at once (the per-caller share of leases: test_call_bounds.py)."""

from __future__ import annotations

import asyncio

import pytest
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc

from services.cache_store import errors
from services.cache_store.disk_tier import DiskTier
from services.cache_store.servicer import CacheStoreServicer, add_to_server
from services.cache_store.store import BlockStore
from services.common.server import NodeServer, ServiceBinding
from services.common.tls.channels import open_channel
from tests.cache_store.helpers import block, blocks, key, keys, names


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_eviction_never_removes_a_block_being_read():
    store = BlockStore(40)
    store.put(blocks("a", "b", "c", "d"))  # a chain: d is evicted first
    reader = store.open_get(keys("c", "d"))
    stream = iter(reader)
    assert next(stream).key == key("c")  # mid-stream: c sent, d not yet
    for name in "wxy":
        store.put([block(name)])  # each evicts the least recent block that is not being read
    assert names(store.memory.keys_lru_first()) == ["d", "c", "x", "y"]  # b, a, then w went
    assert next(stream).data == block("d").data
    reader.close()
    store.put(blocks("p", "q", "r", "s"))  # released: c and d may go now
    assert names(store.memory.keys_lru_first()) == ["s", "r", "q", "p"]
    store.check_integrity()


def test_put_that_cannot_make_room_because_of_leases_is_refused_and_says_so():
    store = BlockStore(30)
    store.put(blocks("a", "b", "c"))
    with store.open_get(keys("a", "b")):
        with pytest.raises(errors.StoreFullError, match="20 bytes are held by blocks being read"):
            store.put(blocks("x", "y"))
        assert names(store.memory.keys_lru_first()) == ["c", "b", "a"]
        store.put([block("x")])  # c is not leased
        assert names(store.memory.keys_lru_first()) == ["b", "a", "x"]
    store.put(blocks("y", "z"))
    assert names(store.memory.keys_lru_first()) == ["x", "z", "y"]


def test_leased_disk_blocks_are_not_evicted_from_disk(tmp_path):
    store = BlockStore(10, DiskTier(tmp_path, 30))
    for name in "abcd":
        store.put([block(name)])
    assert names(store.disk.keys_lru_first()) == ["a", "b", "c"]
    with store.open_get(keys("a", "b")) as reader:  # on disk only; not read yet
        for name in "efg":
            store.put([block(name)])  # memory spills into disk, which drops c, d, e but not a, b
        assert names(store.disk.keys_lru_first()) == ["a", "b", "f"]
        assert [b.data for b in reader] == [block("a").data, block("b").data]
    assert store.stats().disk_hits_total == 2
    store.check_integrity()


def test_a_lease_expires_lease_s_after_its_get_began():
    clock = Clock()
    store = BlockStore(20, lease_s=30, clock=clock)
    store.put(blocks("a", "b"))
    clock.now = 5
    reader = store.open_get(keys("b", "a"))  # held until 35 at the latest
    stream = iter(reader)
    clock.now = 25
    next(stream)  # serving a block does not renew it (a slow reader could hold it forever)
    clock.now = 34
    with pytest.raises(errors.StoreFullError, match="being read"):
        store.put([block("x", size=20)])
    clock.now = 35  # the stream was abandoned without being closed
    assert store.put([block("x", size=20)]).evicted == 2
    assert (len(store.leases), store.leases.expired_total) == (0, 1)
    reader.close()  # late close of an expired lease is harmless
    assert names(store.memory.keys_lru_first()) == ["x"]


async def test_a_cancelled_get_stream_releases_its_lease():
    store = BlockStore(1 << 20)
    store.put([block(f"b{i}", size=40_000) for i in range(8)])
    servicer = CacheStoreServicer(store, chunk_bytes=1000)
    server = NodeServer([ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer,
                                        add_to_server)], listen="127.0.0.1:0", grace_s=0)
    await server.start()
    try:
        async with open_channel(server.address, "cache-store") as channel:
            call = cache_store_pb2_grpc.CacheStoreStub(channel).Get(
                cache_store_pb2.GetRequest(keys=[key(f"b{i}") for i in range(8)]))
            first = await call.read()
            assert first.key == key("b0") and len(store.leases) == 1
            call.cancel()
            for _ in range(100):
                if not store.leases.pinned():
                    break
                await asyncio.sleep(0.01)
            assert not store.leases.pinned() and servicer.in_flight == 0
    finally:
        await server.shutdown()

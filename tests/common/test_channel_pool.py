"""ChannelPool on real grpc.aio servers: one channel per address, channels of gone or unused peers
closed, a channel carrying a call never closed."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc

from services.common.channel_pool import ChannelPool
from services.common.server import NodeServer, ServiceBinding


class SlowLookup(cache_store_pb2_grpc.CacheStoreServicer):
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def Lookup(self, request, context):
        self.started.set()
        await self.release.wait()
        return cache_store_pb2.LookupResponse(num_prefix_hits=len(request.keys))


async def serve(servicer: SlowLookup) -> NodeServer:
    binding = ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer,
                             cache_store_pb2_grpc.add_CacheStoreServicer_to_server)
    server = NodeServer([binding], listen="127.0.0.1:0", grace_s=0)
    await server.start()
    return server


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def wait_state(pool_channel: grpc.aio.Channel, states: tuple[grpc.ChannelConnectivity, ...]) -> None:
    async def settle() -> None:
        while (state := pool_channel.get_state(try_to_connect=False)) not in states:
            await pool_channel.wait_for_state_change(state)

    await asyncio.wait_for(settle(), 10)


async def test_one_channel_per_address_and_a_gone_peer_is_closed_after_the_idle_time():
    clock = Clock()
    pool = ChannelPool("cache-store", idle_close_s=60, sweep_interval_s=1, clock=clock)
    servicer = SlowLookup()
    server = await serve(servicer)
    address = server.address
    try:
        stub = pool.stub(address, cache_store_pb2_grpc.CacheStoreStub)
        pool.stub(address, cache_store_pb2_grpc.CacheStoreStub)
        assert pool.addresses() == [address]
        servicer.release.set()
        assert (await stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]))).num_prefix_hits == 1
    finally:
        await server.shutdown()
    channel = pool._entries[address].channel
    await wait_state(channel, (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.TRANSIENT_FAILURE))
    clock.now = 30
    assert pool.sweep() == [], "closed before its idle time"
    clock.now = 61
    assert pool.sweep() == [address]
    assert pool.addresses() == [] and pool.closed_total == 1
    await pool.close()


async def test_a_channel_carrying_a_call_is_not_closed():
    clock = Clock()
    pool = ChannelPool("cache-store", idle_close_s=60, sweep_interval_s=1, clock=clock)
    servicer = SlowLookup()
    server = await serve(servicer)
    try:
        stub = pool.stub(server.address, cache_store_pb2_grpc.CacheStoreStub)
        call = asyncio.ensure_future(stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a", b"b"])))
        await asyncio.wait_for(servicer.started.wait(), 10)
        clock.now = 1000
        assert pool.sweep() == [], "a channel with a call in flight was closed"
        servicer.release.set()
        assert (await call).num_prefix_hits == 2
        # the next call opens nothing new; stub() sweeps on its own once the interval has passed
        clock.now = 2000
        again = pool.stub(server.address, cache_store_pb2_grpc.CacheStoreStub)
        assert (await again.Lookup(cache_store_pb2.LookupRequest(keys=[b"c"]))).num_prefix_hits == 1
        assert pool.addresses() == [server.address]
    finally:
        await pool.close()
        await server.shutdown()


async def test_a_rotated_certificate_opens_a_new_channel_and_closes_the_old(tmp_path, monkeypatch):
    from services.common.tls import identity as identity_module
    from tests.tls_identities import own_rotatable_identity

    monkeypatch.setattr(identity_module, "RECHECK_S", 0.0)
    with own_rotatable_identity(tmp_path / "node", "prefill") as (ca, holder):
        pool = ChannelPool("decode")
        stub = pool.stub("127.0.0.1:1", cache_store_pb2_grpc.CacheStoreStub)
        old = pool._entries["127.0.0.1:1"].channel
        assert pool.stub("127.0.0.1:1", cache_store_pb2_grpc.CacheStoreStub) is not stub  # a stub per call
        assert pool._entries["127.0.0.1:1"].channel is old  # but one channel while the files are unchanged
        ca.issue(holder, ("prefill",))
        pool.stub("127.0.0.1:1", cache_store_pb2_grpc.CacheStoreStub)
        assert pool._entries["127.0.0.1:1"].channel is not old
        for _ in range(100):  # the old one closes in the background (no call on it)
            if old.get_state() == grpc.ChannelConnectivity.SHUTDOWN:
                break
            await asyncio.sleep(0.01)
        assert old.get_state() == grpc.ChannelConnectivity.SHUTDOWN
        await pool.close()

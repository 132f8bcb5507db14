"""NodeServer in-process: binding, health, reflection, error mapping on the wire, graceful shutdown."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pdserve.v1 import admin_pb2, admin_pb2_grpc, cache_store_pb2, cache_store_pb2_grpc

from services.common.errors import InvalidArgumentError, grpc_errors
from services.common.server import NodeServer, ServiceBinding
from services.common.tls.channels import open_channel

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Store(cache_store_pb2_grpc.CacheStoreServicer):
    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    @grpc_errors
    async def Lookup(self, request, context):
        self.calls += 1
        if not request.keys:
            raise InvalidArgumentError("keys", "at least one key is needed")
        if request.keys[0] == b"slow":
            await self.release.wait()
        return cache_store_pb2.LookupResponse(num_prefix_hits=len(request.keys))


def binding(servicer: Store) -> ServiceBinding:
    return ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer,
                          cache_store_pb2_grpc.add_CacheStoreServicer_to_server)


async def health_of(channel: grpc.aio.Channel, service: str = "") -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
    return reply.status


async def test_serves_health_reflection_and_mapped_errors(tmp_path):
    store = Store()
    server = NodeServer([binding(store)], listen="127.0.0.1:0", port_file=tmp_path / "port")
    port = await server.start()
    try:
        assert port > 0 and server.address == f"127.0.0.1:{port}"
        assert (tmp_path / "port").read_text() == f"{port}\n"
        async with open_channel(server.address, "cache-store") as channel:
            assert await health_of(channel) == SERVING
            assert await health_of(channel, "pdserve.v1.CacheStore") == SERVING
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await health_of(channel, "pdserve.v1.Nope")
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

            stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            names = {s.name async for r in stream for s in r.list_services_response.service}
            assert names == {"pdserve.v1.CacheStore", "pdserve.v1.Admin", "grpc.health.v1.Health",
                             "grpc.reflection.v1alpha.ServerReflection"}

            stub = cache_store_pb2_grpc.CacheStoreStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.Lookup(cache_store_pb2.LookupRequest())
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert bad.value.details() == "keys: at least one key is needed"
            assert (await stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]))).num_prefix_hits == 1
    finally:
        await server.shutdown()


async def test_shutdown_marks_not_serving_then_drains_then_stops():
    store = Store()
    seen: list[int] = []
    server: NodeServer

    async def drain() -> None:
        async with open_channel(server.address, "cache-store") as probe:
            seen.append(await health_of(probe))
        store.release.set()  # let the in-flight call finish

    server = NodeServer([binding(store)], listen="127.0.0.1:0", drain=drain, grace_s=2.0)
    await server.start()
    async with open_channel(server.address, "cache-store") as channel:
        stub = cache_store_pb2_grpc.CacheStoreStub(channel)
        in_flight = asyncio.ensure_future(stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"slow", b"x"])))
        while store.calls == 0:
            await asyncio.sleep(0.01)
        server.request_stop()
        await server.shutdown()
        assert seen == [NOT_SERVING]
        assert (await in_flight).num_prefix_hits == 2  # finished during the drain, not cut off
        with pytest.raises(grpc.aio.AioRpcError) as after:
            await stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]), timeout=2)
        assert after.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_admin_drain_rpc_drains_like_sigterm():
    """Admin/Drain answers at once, then the server goes NOT_SERVING, runs the drain hook and stops; an
    in-flight call finishes. A second Drain during the drain says it is already draining."""
    store = Store()
    drained = asyncio.Event()
    server: NodeServer
    seen: list[int] = []

    async def drain() -> None:
        async with open_channel(server.address, "cache-store") as probe:
            seen.append(await health_of(probe))
            again = await admin_pb2_grpc.AdminStub(probe).Drain(admin_pb2.DrainRequest())
            assert again.already_draining
        store.release.set()
        drained.set()

    server = NodeServer([binding(store)], listen="127.0.0.1:0", drain=drain, grace_s=2.0)
    await server.start()
    serving = asyncio.ensure_future(server.serve_until_signalled())
    async with open_channel(server.address, "cache-store") as channel:
        stub = cache_store_pb2_grpc.CacheStoreStub(channel)
        in_flight = asyncio.ensure_future(stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"slow"])))
        while store.calls == 0:
            await asyncio.sleep(0.01)
        reply = await admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest(reason="test"))
        assert not reply.already_draining
        await asyncio.wait_for(serving, 10)
        assert drained.is_set() and seen == [NOT_SERVING]
        assert (await in_flight).num_prefix_hits == 1


async def test_stuck_drain_is_cut_short_by_timeout_and_by_a_second_stop():
    cancelled = []

    async def stuck() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    server = NodeServer([binding(Store())], listen="127.0.0.1:0", drain=stuck, drain_timeout_s=0.1)
    await server.start()
    await asyncio.wait_for(server.shutdown(), 5)
    assert cancelled == [True]

    server = NodeServer([binding(Store())], listen="127.0.0.1:0", drain=stuck, drain_timeout_s=60)
    await server.start()
    serving = asyncio.ensure_future(server.serve_until_signalled())
    await asyncio.sleep(0.05)
    server.request_stop()
    await asyncio.sleep(0.05)
    assert not serving.done()  # draining
    server.request_stop()
    await asyncio.wait_for(serving, 5)
    assert cancelled == [True, True]


async def test_starts_not_serving_until_ready():
    server = NodeServer([binding(Store())], listen="127.0.0.1:0")
    await server.start(serving=False)
    try:
        async with open_channel(server.address, "cache-store") as channel:
            assert await health_of(channel) == NOT_SERVING
            await server.set_serving(True)
            assert await health_of(channel, "pdserve.v1.CacheStore") == SERVING
    finally:
        await server.shutdown()


async def test_bind_failure_is_an_error():
    first = NodeServer([binding(Store())], listen="127.0.0.1:0")
    port = await first.start()
    try:
        second = NodeServer([binding(Store())], listen=f"127.0.0.1:{port}")
        with pytest.raises(OSError, match="cannot bind"):
            await second.start()
    finally:
        await first.shutdown()

"""The gateway's view of the cluster: ClusterStatus, nodes going down and coming back, routing on the
polled numbers, drain, and the real ``python -m services.gateway`` process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import grpc
import grpc.aio
import pytest
import structlog
import structlog.testing
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, decode_pb2, gateway_pb2, gateway_pb2_grpc

from services.cache_store.servicer import CacheStoreServicer
from services.cache_store.store import BlockStore
from services.common.launch import launch
from services.common.server import NodeServer, ServiceBinding
from tests.gateway.conftest import Cluster, start_cluster, stop_cluster
from tests.gateway.fakes import FakeDecode, eventually


async def cluster_status(cluster: Cluster) -> dict[str, gateway_pb2.NodeStatus]:
    reply = await cluster.stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
    return {node.address: node for node in reply.nodes}


async def generate(cluster: Cluster, **fields) -> list[gateway_pb2.GenerateResponse]:
    message = gateway_pb2.GenerateRequest(token_ids=[1, 2, 3], **fields)
    return [r async for r in cluster.stub.Generate(message, timeout=5)]


async def test_cluster_status_lists_every_node_with_its_counters(tokenizer, model_config):
    store = CacheStoreServicer(BlockStore(1 << 20), chunk_bytes=1 << 16)
    store_server = NodeServer([ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], store,
                                              cache_store_pb2_grpc.add_CacheStoreServicer_to_server)],
                              listen="127.0.0.1:0", grace_s=0)
    await store_server.start()
    cluster = await start_cluster(tokenizer, model_config, cache_store=store_server.address)
    try:
        cluster.d.status.blocks_free, cluster.d.status.requests_running = 42, 3
        cluster.d.status.metrics_url = "http://127.0.0.1:9100/metrics"
        nodes = await cluster_status(cluster)
        assert set(nodes) == {cluster.p.address, cluster.d.address, store_server.address}
        p, d, cs = nodes[cluster.p.address], nodes[cluster.d.address], nodes[store_server.address]
        assert (p.role, p.healthy) == ("prefill", True)
        assert (d.role, d.healthy, d.blocks_total, d.blocks_free, d.requests_running) == ("decode", True, 100, 42, 3)
        assert d.metrics_url == "http://127.0.0.1:9100/metrics"
        assert (cs.role, cs.healthy, cs.bytes_total) == ("cache_store", True, 1 << 20)
        # the cache-store is listed, never routed to
        assert [r async for r in cluster.stub.Generate(gateway_pb2.GenerateRequest(token_ids=[1]), timeout=5)]
    finally:
        await stop_cluster(cluster)
        await store_server.shutdown()


async def test_a_stopped_node_turns_unhealthy_and_rejoins_when_restarted(cluster):
    address = cluster.d.address
    port = int(address.rpartition(":")[2])
    await cluster.d.stop()
    nodes = await cluster_status(cluster)
    assert not nodes[address].healthy and nodes[address].blocks_total == 0
    assert nodes[address].error.startswith("UNAVAILABLE: ")  # why, in ClusterStatus
    assert nodes[cluster.p.address].healthy and nodes[cluster.p.address].error == ""
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await generate(cluster)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    # the client reads that no node is healthy, not which or why (the gateway's log and ClusterStatus have it)
    assert error.value.details() == "no healthy decode node (1 known; the gateway's log and ClusterStatus say why)"

    restarted = FakeDecode()
    await restarted.start(port)
    cluster.decode[0] = restarted
    await eventually(lambda: cluster.gateway.directory.nodes("decode")[0].healthy, what="decode node rejoined")
    assert (await cluster_status(cluster))[address].healthy
    assert (await generate(cluster))[-1].finish_reason == "length"
    assert len(restarted.attaches) == 1


async def test_a_draining_node_is_not_routed_to(cluster):
    cluster.p.status.healthy = False  # what a node reports while it drains
    await eventually(lambda: not cluster.gateway.directory.nodes("prefill")[0].healthy, what="poll")
    with structlog.testing.capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as error:
        await generate(cluster)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error.value.details() == "no healthy prefill node (1 known; the gateway's log and ClusterStatus say why)"
    failed = [e for e in logs if e["event"] == "request failed"]
    assert failed and failed[0]["nodes"] == [f"{cluster.p.address}: reports itself unhealthy (draining?)"]
    assert cluster.p.requests == []


async def test_routing_follows_the_polled_load_and_free_blocks(tokenizer, model_config):
    cluster = await start_cluster(tokenizer, model_config, num_prefill=2, num_decode=2)
    try:
        busy_p, idle_p = cluster.prefill
        busy_p.status.requests_waiting = 5
        full_d, roomy_d = cluster.decode
        full_d.status.blocks_free = 3
        await cluster.gateway.directory.refresh()
        for _ in range(3):
            await generate(cluster)
        assert busy_p.requests == [] and len(idle_p.requests) == 3
        assert all(list(r.decode_candidates) == [roomy_d.address, full_d.address] for r in idle_p.requests)
    finally:
        await stop_cluster(cluster)


async def test_drain_refuses_new_requests_and_lets_in_flight_ones_finish(cluster):
    release = asyncio.Event()

    async def attach(request, context):
        await release.wait()
        yield decode_pb2.TokenEvent(token_ids=[5], finish_reason="length")

    cluster.d.script = attach
    call = cluster.stub.Generate(gateway_pb2.GenerateRequest(token_ids=[1, 2]), timeout=5)
    assert len((await call.read()).token_ids) == 1
    core = cluster.gateway.core
    drain = asyncio.ensure_future(core.drain(grace_s=5))
    await eventually(lambda: core.draining, what="draining")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await generate(cluster)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in refused.value.details()
    release.set()
    assert (await call.read()).finish_reason == "length"
    await asyncio.wait_for(drain, 2)
    assert cluster.d.aborts == []


async def test_drain_cancels_what_is_left_after_the_grace_period(cluster):
    async def attach(request, context):
        await asyncio.Event().wait()
        yield decode_pb2.TokenEvent()

    cluster.d.script = attach
    call = cluster.stub.Generate(gateway_pb2.GenerateRequest(token_ids=[1, 2]), timeout=5)
    request_id = (await call.read()).request_id
    await asyncio.wait_for(cluster.gateway.core.drain(grace_s=0.1), 3)
    with pytest.raises(grpc.aio.AioRpcError) as cut:
        await call.read()
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in cut.value.details()
    assert cluster.d.aborts == [request_id]


async def test_the_gateway_process_serves_and_exits_cleanly_on_sigterm(cluster):
    """``python -m services.gateway`` against the fake nodes: health, ClusterStatus, Generate, SIGTERM; the
    process never maps torch's libraries (``services.gateway.torch_free``)."""
    args = ("--prefill", cluster.p.address, "--decode", cluster.d.address, "--log-level", "warning")

    def run_process(ready: asyncio.Future, done: asyncio.Event, loop: asyncio.AbstractEventLoop) -> int:
        with launch("services.gateway", *args, stderr=subprocess.DEVNULL, startup_timeout_s=60) as node:
            loop.call_soon_threadsafe(ready.set_result, (node.address, node.process.pid))
            asyncio.run_coroutine_threadsafe(done.wait(), loop).result(60)
            node.process.send_signal(signal.SIGTERM)
            return node.process.wait(10)

    loop = asyncio.get_running_loop()
    ready: asyncio.Future[tuple[str, int]] = loop.create_future()
    done = asyncio.Event()
    exited = asyncio.ensure_future(asyncio.to_thread(run_process, ready, done, loop))
    try:
        await asyncio.wait({ready, exited}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            exited.result()  # the process failed to start: raise why
        address, pid = ready.result()
        async with grpc.aio.insecure_channel(address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="pdserve.v1.Gateway"))
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            stub = gateway_pb2_grpc.GatewayStub(channel)
            status = await stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
            assert {n.address: n.healthy for n in status.nodes} == {cluster.p.address: True,
                                                                      cluster.d.address: True}
            replies = [r async for r in stub.Generate(gateway_pb2.GenerateRequest(prompt="Hi"), timeout=5)]
            assert replies[-1].finish_reason == "length"
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text(), "the gateway process loaded torch"
    finally:
        done.set()
        assert await asyncio.wait_for(exited, 20) == 0

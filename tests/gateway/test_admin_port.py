"""The gateway's ``Admin`` on ``--admin-listen``: mTLS with the cluster's CA, and only an admin
certificate may drain; another role of the cluster gets ``PERMISSION_DENIED``, a caller without a
certificate no connection. The public port does not serve ``Admin`` at all (``UNIMPLEMENTED``)."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pdserve.v1 import admin_pb2, admin_pb2_grpc

from services.common.tls.channels import open_channel
from tests.gateway.conftest import Cluster, start_cluster, stop_cluster
from tests.tls_identities import foreign_identity, identity_of


@pytest.fixture
async def with_admin_port(tokenizer, model_config):
    cluster = await start_cluster(tokenizer, model_config, admin_listen="127.0.0.1:0")
    try:
        yield cluster
    finally:
        await stop_cluster(cluster)


def admin_address(cluster: Cluster) -> str:
    port = cluster.gateway.server.admin_port
    assert port is not None
    return f"127.0.0.1:{port}"


async def drain_as(cluster: Cluster, identity) -> admin_pb2.DrainResponse:
    async with open_channel(admin_address(cluster), "gateway", identity=identity) as channel:
        return await admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest(), timeout=5)


async def test_only_an_admin_identity_drains_the_gateway_and_only_on_its_admin_port(with_admin_port):
    cluster = with_admin_port
    with pytest.raises(grpc.aio.AioRpcError) as public:
        await admin_pb2_grpc.AdminStub(cluster.channel).Drain(admin_pb2.DrainRequest(), timeout=5)
    assert public.value.code() == grpc.StatusCode.UNIMPLEMENTED
    for role in ("gateway", "prefill", "decode"):
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await drain_as(cluster, identity_of(role))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED, role
        assert "Admin/Drain" in (denied.value.details() or "")
    for stranger in (None, foreign_identity("admin")):  # no certificate; an admin certificate of another CA
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await drain_as(cluster, stranger)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not cluster.gateway.server.stopping
    async with open_channel(admin_address(cluster), "gateway", identity=identity_of("prefill")) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # health there: any cluster role
    await drain_as(cluster, identity_of("admin"))
    assert cluster.gateway.server.stopping


async def test_without_admin_listen_there_is_no_admin_port(cluster):
    assert cluster.gateway.server.admin_port is None
    with pytest.raises(grpc.aio.AioRpcError) as public:
        await admin_pb2_grpc.AdminStub(cluster.channel).Drain(admin_pb2.DrainRequest(), timeout=5)
    assert public.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert not cluster.gateway.server.stopping

"""A Kubernetes gRPC probe presents no certificate: ``--health-listen`` opens a plaintext port that answers
``grpc.health.v1`` — and nothing else — while the main port stays mTLS-only. A real cache-store process,
its certificate found through $PDSERVE_MTLS_DIR (the session CA, conftest)."""

from __future__ import annotations

import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pdserve.v1 import admin_pb2, admin_pb2_grpc, cache_store_pb2, cache_store_pb2_grpc

from services.common.launch import launch
from services.common.ports import free_port
from tests.e2e.mtls_calls import health

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def store():
    health_address = f"127.0.0.1:{free_port()}"
    with launch("services.cache_store", "--health-listen", health_address, stderr=subprocess.DEVNULL) as node:
        node.health_address = health_address  # type: ignore[attr-defined]
        yield node


def test_the_health_port_answers_a_plaintext_check_without_a_certificate(store):
    with grpc.insecure_channel(store.health_address) as channel:
        health_stub = health_pb2_grpc.HealthStub(channel)
        assert health_stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == SERVING
        reply = health_stub.Check(health_pb2.HealthCheckRequest(service="pdserve.v1.CacheStore"), timeout=10)
        assert reply.status == SERVING


def test_the_health_port_serves_nothing_but_health(store):
    with grpc.insecure_channel(store.health_address) as channel:
        with pytest.raises(grpc.RpcError) as lookup:
            cache_store_pb2_grpc.CacheStoreStub(channel).Lookup(cache_store_pb2.LookupRequest(keys=[b"k"]), timeout=10)
        with pytest.raises(grpc.RpcError) as drain:
            admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest(reason="probe"), timeout=10)
    assert lookup.value.code() == drain.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert store.process.poll() is None


def test_the_main_port_stays_mtls_only(store):
    with grpc.insecure_channel(store.address) as channel, pytest.raises(grpc.RpcError) as plaintext:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    assert health(store.address, "cache-store") == SERVING  # with a certificate: the same answer

"""Bytes that are not a request message get INVALID_ARGUMENT naming the method, on every method of every
process of a real cluster, and change nothing (grpc.aio's own answer is UNKNOWN "Unexpected DecodeError")."""

from __future__ import annotations

import grpc
import pytest
from pdserve.v1 import admin_pb2, cache_store_pb2, decode_pb2, gateway_pb2, prefill_pb2

from services.common.tls.channels import open_sync_channel
from tests.e2e.conftest import generate, greedy, wait_idle

CORRUPT = b"\xff\xff\xff\xff\xff"  # a tag that is not a varint: "wire format was corrupt" for any message
BAD_UTF8 = gateway_pb2.GenerateRequest(request_id="x").SerializeToString().replace(b"x", b"\xff")
SERVICES = {
    "gateway": gateway_pb2.DESCRIPTOR.services_by_name["Gateway"],
    "prefill": prefill_pb2.DESCRIPTOR.services_by_name["PrefillNode"],
    "decode": decode_pb2.DESCRIPTOR.services_by_name["DecodeNode"],
    "cache_store": cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"],
}
ADMIN = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
CERTIFICATE_ROLE = {"prefill": "prefill", "decode": "decode", "cache_store": "cache-store"}


def channel_to(role: str, address: str) -> grpc.Channel:
    """The gateway's public port in plaintext; a node over mTLS with the test identity (every role, admin
    included: the role check passes, so what is refused is the bytes)."""
    if role == "gateway":
        return grpc.insecure_channel(address)
    return open_sync_channel(address, CERTIFICATE_ROLE[role])


def call_with(channel: grpc.Channel, method, payload: bytes) -> grpc.RpcError:
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.client_streaming:
        call = channel.stream_stream(path) if method.server_streaming else channel.stream_unary(path)
        send = iter([payload])
    else:
        call = channel.unary_stream(path) if method.server_streaming else channel.unary_unary(path)
        send = payload
    with pytest.raises(grpc.RpcError) as raised:
        reply = call(send, timeout=10)
        list(reply) if method.server_streaming else reply
    return raised.value


def test_every_method_refuses_bytes_that_do_not_parse(cluster, stub):
    nodes = {(n.role, n.address) for n in stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10).nodes}
    nodes.add(("gateway", cluster.address))
    assert {role for role, _ in nodes} == set(SERVICES)
    for role, address in sorted(nodes):
        admin = [] if role == "gateway" else ADMIN.methods  # the gateway's Admin is on its --admin-listen only
        with channel_to(role, address) as channel:
            for method in [*SERVICES[role].methods, *admin]:
                error = call_with(channel, method, CORRUPT)
                where = f"{role} {method.full_name}"
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {error}"
                assert "not a valid" in error.details(), where
                if not method.client_streaming:
                    assert f"/{method.containing_service.full_name}/{method.name}" in error.details(), where
    with grpc.insecure_channel(cluster.address) as channel:
        error = call_with(channel, SERVICES["gateway"].methods_by_name["Generate"], BAD_UTF8)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in error.details()
    # nothing drained, nothing held: the cluster still serves
    assert all(n.healthy for n in wait_idle(stub))
    assert len(generate(stub, prompt="Hello", sampling=greedy(2))[0]) == 2

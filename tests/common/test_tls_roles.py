"""Caller roles: the policy table's rules, and RoleCheck on a real mTLS NodeServer serving a real proto
service — the right role is served, a wrong one refused naming the method, a certificate without a role
is unauthenticated, a foreign CA or plaintext never gets past the handshake, each refusal logged once."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc

from services.common.server import NodeServer, ServiceBinding
from services.common.tls.ca import ClusterCA, role_dns
from services.common.tls.callers import CALLERS, INTERNAL_POLICY
from services.common.tls.channels import open_channel
from services.common.tls.roles import ANY_ROLE, RolePolicy
from tests.common.tls_certs import issue_without_role
from tests.tls_identities import foreign_identity, identity_of, session_root

LOOKUP = "pdserve.v1.CacheStore/Lookup"


class Store(cache_store_pb2_grpc.CacheStoreServicer):
    """Counts what reaches it: a refused call never does."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def Lookup(self, request, context):
        self.calls.append("Lookup")
        return cache_store_pb2.LookupResponse(num_prefix_hits=len(request.keys))

    async def Put(self, request_iterator, context):
        self.calls.append("Put")
        count = 0
        async for _ in request_iterator:
            count += 1
        return cache_store_pb2.PutResponse(num_stored=count)

    async def Get(self, request, context):
        self.calls.append("Get")
        for key in request.keys:
            yield cache_store_pb2.GetChunk(key=key)


@pytest.fixture
async def server():
    """A NodeServer as every internal node runs: mTLS with the process identity (the session's test
    certificate, conftest), RoleCheck with the cluster's table."""
    store = Store()
    node = NodeServer([ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], store,
                                      cache_store_pb2_grpc.add_CacheStoreServicer_to_server)],
                      listen="127.0.0.1:0")
    await node.start()
    node.store = store  # type: ignore[attr-defined]
    try:
        yield node
    finally:
        await node.shutdown()


def stub_as(server: NodeServer, identity) -> tuple[grpc.aio.Channel, cache_store_pb2_grpc.CacheStoreStub]:
    channel = open_channel(server.address, "cache-store", identity=identity)
    return channel, cache_store_pb2_grpc.CacheStoreStub(channel)


async def one_put(stub, key: bytes = b"k"):
    async def chunks():
        yield cache_store_pb2.PutChunk(key=key, total_length=1, data=b"x", end_of_put=True)

    return await stub.Put(chunks(), timeout=10)


async def first_chunk(stub):
    stream = stub.Get(cache_store_pb2.GetRequest(keys=[b"k"]), timeout=10)
    return await stream.read()


# --- RolePolicy -------------------------------------------------------------------------------------------


def test_a_method_no_rule_names_is_closed():
    policy = RolePolicy({"pkg.Service/Open": ("gateway",)})
    assert policy.accepted("/pkg.Service/Open") == {"gateway"}
    assert policy.accepted("pkg.Service/New") == frozenset()
    assert policy.accepted("/other.Service/Open") == frozenset()
    assert INTERNAL_POLICY.accepted("/pdserve.v1.DecodeNode/SomethingNew") == frozenset()


def test_a_service_wide_rule_covers_its_methods_and_a_method_rule_wins():
    policy = RolePolicy({"pkg.Service": ("decode",), "pkg.Service/Narrow": ("admin",)})
    assert policy.accepted("/pkg.Service/Any") == {"decode"}
    assert policy.accepted("/pkg.Service/Narrow") == {"admin"}
    assert policy.accepted("/grpc.health.v1.Health/Check") == set(ANY_ROLE)
    assert policy.accepted("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") == set(ANY_ROLE)


def test_admin_is_for_the_admin_role_only():
    assert RolePolicy({}).accepted("/pdserve.v1.Admin/Drain") == {"admin"}
    assert INTERNAL_POLICY.accepted("/pdserve.v1.Admin/Drain") == {"admin"}
    assert all("pdserve.v1.Admin" not in name for name in CALLERS)  # no table entry opens it wider


def test_an_unknown_role_in_the_table_is_refused():
    with pytest.raises(ValueError, match=r"unknown roles \['root'\]"):
        RolePolicy({"pkg.Service/M": ("root",)})


@pytest.mark.parametrize(("method", "roles"), [
    ("pdserve.v1.DecodeNode/Reserve", {"prefill"}), ("pdserve.v1.DecodeNode/TransferKV", {"prefill"}),
    ("pdserve.v1.DecodeNode/OpenKVIpc", {"prefill"}), ("pdserve.v1.DecodeNode/Attach", {"gateway"}),
    ("pdserve.v1.DecodeNode/Adopt", {"decode", "gateway"}),  # a gateway: tokens only (the servicer checks)
    ("pdserve.v1.CacheStore/Put", {"prefill", "decode"}),
    ("pdserve.v1.CacheStore/Delete", {"prefill", "decode"}), ("pdserve.v1.PrefillNode/Prefill", {"gateway"}),
    ("pdserve.v1.PrefillNode/Embed", {"gateway"}),
])
def test_the_cluster_table_says_what_the_issue_asks(method, roles):
    assert INTERNAL_POLICY.accepted(method) == roles


# --- RoleCheck on a real server ------------------------------------------------------------------------------


async def test_the_right_role_is_served(server):
    for role in ("prefill", "decode", "gateway"):
        channel, stub = stub_as(server, identity_of(role))
        async with channel:
            reply = await stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a", b"b"]), timeout=10)
            assert reply.num_prefix_hits == 2
    channel, stub = stub_as(server, identity_of("decode"))
    async with channel:
        assert (await one_put(stub)).num_stored == 1
        assert (await first_chunk(stub)).key == b"k"
    assert server.store.calls == ["Lookup"] * 3 + ["Put", "Get"]


@pytest.mark.parametrize(("role", "call", "method"), [
    ("admin", lambda s: s.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]), timeout=10), LOOKUP),
    ("cache-store", lambda s: s.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]), timeout=10), LOOKUP),
    ("gateway", one_put, "pdserve.v1.CacheStore/Put"),
    ("admin", one_put, "pdserve.v1.CacheStore/Put"),
    ("gateway", first_chunk, "pdserve.v1.CacheStore/Get"),
])
async def test_a_wrong_role_is_refused_naming_the_method_and_never_reaches_the_servicer(server, role, call, method):
    channel, stub = stub_as(server, identity_of(role))
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(stub)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details().startswith(f"{method}: a caller with role {role} may not call it (accepted: ")
    assert server.store.calls == []


def credentials_without_role(tmp_path) -> grpc.ChannelCredentials:
    holder = issue_without_role(ClusterCA.load(session_root() / "ca"), tmp_path / "norole")
    return grpc.ssl_channel_credentials((holder / "ca.crt").read_bytes(), (holder / "tls.key").read_bytes(),
                                        (holder / "tls.crt").read_bytes())


async def test_a_certificate_of_the_cluster_ca_without_a_role_is_unauthenticated(server, tmp_path):
    options = [("grpc.ssl_target_name_override", role_dns("cache-store"))]
    async with grpc.aio.secure_channel(server.address, credentials_without_role(tmp_path), options) as channel:
        stub = cache_store_pb2_grpc.CacheStoreStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == f"{LOOKUP}: the caller's certificate names no pdserve role (spiffe://pdserve/<role>)"
    assert server.store.calls == []


def foreign_client_credentials(role: str) -> grpc.ChannelCredentials:
    """Trusts the cluster CA (so the server is accepted) but presents a certificate of another CA."""
    pair = foreign_identity(role).current()
    return grpc.ssl_channel_credentials((session_root() / "ca" / "ca.crt").read_bytes(), pair.key, pair.cert)


@pytest.mark.parametrize("client", ["plaintext", "foreign CA", "foreign CA both ways", "no client certificate"])
async def test_a_caller_without_a_cluster_certificate_fails_the_handshake(server, client):
    options = [("grpc.ssl_target_name_override", role_dns("cache-store"))]
    if client == "plaintext":
        channel = grpc.aio.insecure_channel(server.address)
    elif client == "foreign CA":
        channel = grpc.aio.secure_channel(server.address, foreign_client_credentials("prefill"), options)
    elif client == "foreign CA both ways":
        channel = open_channel(server.address, "cache-store", identity=foreign_identity("prefill"))
    else:
        ca = (session_root() / "ca" / "ca.crt").read_bytes()
        channel = grpc.aio.secure_channel(server.address, grpc.ssl_channel_credentials(ca), options)
    async with channel:
        stub = cache_store_pb2_grpc.CacheStoreStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]), timeout=10)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.store.calls == []
    async with open_channel(server.address, "cache-store") as channel:  # the server is none the worse
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_each_refusal_is_logged_once_per_caller_and_method(server):
    with structlog.testing.capture_logs() as logs:
        for role in ("admin", "admin", "admin", "cache-store"):
            channel, stub = stub_as(server, identity_of(role))
            async with channel:
                for _ in range(2):
                    with pytest.raises(grpc.aio.AioRpcError):
                        await stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"a"]), timeout=10)
                with pytest.raises(grpc.aio.AioRpcError):
                    await one_put(stub)
    refused = [(e["method"], tuple(e["roles"]), e["code"]) for e in logs if e["event"] == "caller refused"]
    assert sorted(refused) == [
        ("pdserve.v1.CacheStore/Lookup", ("admin",), "PERMISSION_DENIED"),
        ("pdserve.v1.CacheStore/Lookup", ("cache-store",), "PERMISSION_DENIED"),
        ("pdserve.v1.CacheStore/Put", ("admin",), "PERMISSION_DENIED"),
        ("pdserve.v1.CacheStore/Put", ("cache-store",), "PERMISSION_DENIED"),
    ]
    assert all(e["log_level"] == "warning" and e["peer"] for e in logs if e["event"] == "caller refused")
    # the caller: its certificate's common name (one certificate per role here, named after it)
    assert {e["caller"] for e in logs if e["event"] == "caller refused"} == {"cn:admin", "cn:cache-store"}

"""Calling any internal method as any identity, with raw (empty) messages, and reading the certificate a
server presents — for the end-to-end tests of the cluster's mTLS (``test_mtls_*.py``)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pdserve.v1 import admin_pb2, cache_store_pb2, decode_pb2, prefill_pb2

from services.common.tls.ca import ROLES, role_dns
from services.common.tls.callers import INTERNAL_POLICY
from services.common.tls.channels import open_sync_channel
from tests.tls_identities import session_root

SERVICES = {"prefill": prefill_pb2.DESCRIPTOR.services_by_name["PrefillNode"],
            "decode": decode_pb2.DESCRIPTOR.services_by_name["DecodeNode"],
            "cache-store": cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"]}
ADMIN = admin_pb2.DESCRIPTOR.services_by_name["Admin"]


@dataclass(frozen=True)
class Method:
    path: str  # /pdserve.v1.DecodeNode/Reserve
    client_streaming: bool
    server_streaming: bool

    @property
    def name(self) -> str:
        return self.path.lstrip("/")

    def wrong_roles(self) -> list[str]:
        """Every role the cluster's table does not let call it."""
        return [r for r in ROLES if r not in INTERNAL_POLICY.accepted(self.path)]


def methods_of(service) -> list[Method]:
    return [Method(f"/{service.full_name}/{m.name}", m.client_streaming, m.server_streaming) for m in service.methods]


def call_raw(channel: grpc.Channel, method: Method, timeout: float = 20.0) -> None:
    """One call with an empty message (the first response of a streaming one); raises ``grpc.RpcError``."""
    empty = b""
    if method.client_streaming and method.server_streaming:
        next(iter(channel.stream_stream(method.path)(iter([empty]), timeout=timeout)))
    elif method.client_streaming:
        channel.stream_unary(method.path)(iter([empty]), timeout=timeout)
    elif method.server_streaming:
        next(iter(channel.unary_stream(method.path)(empty, timeout=timeout)))
    else:
        channel.unary_unary(method.path)(empty, timeout=timeout)


def refusal(channel: grpc.Channel, method: Method) -> grpc.RpcError:
    """The error ``method`` ends with (AssertionError when it was served)."""
    try:
        call_raw(channel, method)
    except grpc.RpcError as error:
        return error
    raise AssertionError(f"{method.name} was served")


def health(address: str, role: str, identity=True) -> int:
    with open_sync_channel(address, role, identity=identity) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def channels_without_certificate(address: str, role: str, foreign) -> Iterator[tuple[str, grpc.Channel]]:
    """Plaintext; TLS trusting the cluster CA but presenting no certificate; presenting one of another CA."""
    ca = (session_root() / "ca" / "ca.crt").read_bytes()
    options = [("grpc.ssl_target_name_override", role_dns(role))]
    pair = foreign.current()
    yield "plaintext", grpc.insecure_channel(address)
    yield "no certificate", grpc.secure_channel(address, grpc.ssl_channel_credentials(ca), options)
    yield "foreign CA", grpc.secure_channel(address, grpc.ssl_channel_credentials(ca, pair.key, pair.cert), options)


def served_certificate(address: str, role: str, holder: str = "test") -> x509.Certificate:
    """The certificate the server at ``address`` presents to a NEW connection: a TLS handshake of our own
    (presenting ``holder``'s certificate of the session CA, as its port requires, verifying the server for
    ``<role>.pdserve.internal`` against the session CA) — gRPC does not show a client the server's
    certificate."""
    root = session_root()
    context = ssl.create_default_context(cafile=str(root / "ca" / "ca.crt"))
    context.load_cert_chain(str(root / holder / "tls.crt"), str(root / holder / "tls.key"))
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock, \
            context.wrap_socket(sock, server_hostname=role_dns(role)) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)

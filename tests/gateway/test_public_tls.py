"""TLS on the gateway's public ports (``--tls-cert``/``--tls-key``): a real gateway process serves gRPC and
HTTPS with a certificate of a CA of its own (not the cluster's); TLS clients are served, plaintext ones are
not; API keys work over TLS; the files replaced while it runs are presented at the next handshake, by the
same process. In-process: the client CLI's ``--tls-ca``, the settings' checks, a half-written pair."""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import pytest
import structlog
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.client.__main__ import main as client_main
from services.common.launch import ServiceProcess, launch
from services.common.ports import wait_for_port_file
from services.common.tls.ca import ClusterCA
from services.gateway.config import GatewayConfig
from services.gateway.public_tls import PublicTls
from tests.gateway.conftest import start_cluster, stop_cluster

KEY = "sk-tls-0123456789"
NO_NODES = ("--prefill", "127.0.0.1:9", "--decode", "127.0.0.1:10")  # the gateway serves without them


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture
def public(tmp_path) -> tuple[ClusterCA, Path]:
    """A public CA (not the cluster's) and the gateway's certificate directory it issued into."""
    ca = ClusterCA.create("test public CA")
    return ca, ca.issue(tmp_path / "public", ("gateway",), hosts=("127.0.0.1", "localhost"))


def tls_args(directory: Path) -> tuple[str, ...]:
    return "--tls-cert", str(directory / "tls.crt"), "--tls-key", str(directory / "tls.key")


def credentials(directory: Path) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials((directory / "ca.crt").read_bytes())


def https_context(directory: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(directory / "ca.crt"))


def served_serial(port: int, directory: Path, alpn: str) -> int:
    """The serial of the certificate a new connection to ``port`` is shown (verified against the CA)."""
    context = https_context(directory)
    context.set_alpn_protocols([alpn])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
        der = connection.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def cert_serial(directory: Path) -> int:
    return x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes()).serial_number


@contextmanager
def tls_gateway(directory: Path, log: Path, env: dict[str, str] | None = None) -> Iterator[ServiceProcess]:
    """``python -m services.gateway`` with public TLS and an HTTP front, waited for over TLS (the launcher's
    own check is plaintext)."""
    with log.open("wb") as out, launch("services.gateway", *NO_NODES, *tls_args(directory), "--http-listen",
                                       "127.0.0.1:0", env=env, stdout=out.fileno(), stderr=out.fileno(),
                                       wait=False) as node:
        node.address = f"127.0.0.1:{wait_for_port_file(node.port_file, 60, node.process)}"
        with grpc.secure_channel(node.address, credentials(directory)) as channel:
            stub, deadline = health_pb2_grpc.HealthStub(channel), time.monotonic() + 60
            while (stub.Check(health_pb2.HealthCheckRequest(), timeout=5, wait_for_ready=True).status
                   != health_pb2.HealthCheckResponse.SERVING):
                assert time.monotonic() < deadline and node.process.poll() is None, log.read_text()
                time.sleep(0.05)
        yield node
        node.process.send_signal(signal.SIGTERM)
        assert node.process.wait(20) == 0


def status(address: str, directory: Path, key: str = KEY) -> gateway_pb2.ClusterStatusResponse:
    with grpc.secure_channel(address, credentials(directory)) as channel:
        return gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5,
                                                                   metadata=auth(key))


def test_tls_clients_are_served_on_grpc_and_https_with_api_keys_and_plaintext_ones_are_not(public, tmp_path):
    _, directory = public
    with tls_gateway(directory, tmp_path / "log", env={"PDSERVE_API_KEY": KEY}) as node:
        http_url = status(node.address, directory).http_url
        assert http_url.startswith("https://127.0.0.1:")
        with grpc.secure_channel(node.address, credentials(directory)) as channel:
            with pytest.raises(grpc.RpcError) as keyless:
                gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
            assert keyless.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(node.address) as plain, pytest.raises(grpc.RpcError) as refused:
            gateway_pb2_grpc.GatewayStub(plain).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5,
                                                               metadata=auth(KEY))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.secure_channel(node.address, grpc.ssl_channel_credentials()) as untrusted, \
                pytest.raises(grpc.RpcError) as unverified:  # the system's roots do not know this CA
            gateway_pb2_grpc.GatewayStub(untrusted).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
        assert unverified.value.code() == grpc.StatusCode.UNAVAILABLE

        context = https_context(directory)
        assert httpx.get(f"{http_url}/health", verify=context).status_code == 200
        assert httpx.get(f"{http_url}/v1/models", verify=context).status_code == 401
        models = httpx.get(f"{http_url}/v1/models", verify=context, headers={"Authorization": f"Bearer {KEY}"})
        assert models.status_code == 200 and models.json()["data"]
        request = urllib.request.Request(f"{http_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, context=context, timeout=5) as reply:
            assert reply.status == 200
        with pytest.raises(httpx.TransportError):  # plain HTTP on the HTTPS port
            httpx.get(http_url.replace("https://", "http://") + "/health", timeout=5)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{http_url}/health")


def test_a_replaced_certificate_is_presented_to_new_connections_without_a_restart(public, tmp_path):
    ca, directory = public
    log = tmp_path / "log"
    with tls_gateway(directory, log) as node:
        grpc_port = int(node.address.rpartition(":")[2])
        http_port = int(status(node.address, directory).http_url.rpartition(":")[2])
        first = cert_serial(directory)
        assert served_serial(grpc_port, directory, "h2") == first == served_serial(http_port, directory, "http/1.1")
        opened = grpc.secure_channel(node.address, credentials(directory))
        try:
            stub = gateway_pb2_grpc.GatewayStub(opened)
            stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)  # connected with the first cert
            pid = node.process.pid
            ca.issue(directory, ("gateway",), hosts=("127.0.0.1", "localhost"))
            second = cert_serial(directory)
            assert second != first
            deadline = time.monotonic() + 20
            while {served_serial(grpc_port, directory, "h2"),
                   served_serial(http_port, directory, "http/1.1")} != {second}:
                assert time.monotonic() < deadline, "the new certificate was never presented"
                time.sleep(0.2)
            assert status(node.address, directory).http_url  # a new TLS channel is served
            stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)  # the open one still is
            assert node.process.pid == pid and node.process.poll() is None  # the same process, never restarted
        finally:
            opened.close()
    assert "public TLS certificate reloaded" in log.read_text()


async def test_the_client_cli_verifies_the_gateway_with_tls_ca(tokenizer, model_config, public):
    _, directory = public
    cluster = await start_cluster(tokenizer, model_config, tls_cert=directory / "tls.crt",
                                  tls_key=directory / "tls.key")
    try:
        run = ["hi", "--address", cluster.gateway.server.address, "--max-tokens", "2", "--timeout", "5"]
        assert await asyncio.to_thread(client_main, [*run, "--tls-ca", str(directory / "ca.crt")]) == 0
        assert await asyncio.to_thread(client_main, run) == 1  # plaintext to a TLS port
        assert await asyncio.to_thread(client_main, [*run, "--tls"]) == 1  # the system roots do not know the CA
        assert len(cluster.p.requests) == 1
    finally:
        await stop_cluster(cluster)


def test_the_client_cli_refuses_a_ca_file_it_cannot_use(tmp_path, capsys):
    (tmp_path / "not-pem").write_text("hello")
    for path, complaint in ((tmp_path / "absent", "cannot read"), (tmp_path / "not-pem", "holds no PEM")):
        with pytest.raises(SystemExit) as exited:
            client_main(["hi", "--tls-ca", str(path)])
        assert exited.value.code == 2 and complaint in capsys.readouterr().err


@pytest.mark.parametrize("given", [{"tls_cert": Path("c")}, {"tls_key": Path("k")}])
def test_tls_cert_and_key_come_together(given):
    with pytest.raises(ValueError, match="tls_cert and tls_key: give both"):
        GatewayConfig(prefill="127.0.0.1:1", decode="127.0.0.1:2", **given)


def test_a_pair_that_does_not_load_is_refused_at_start_and_skipped_when_rotated_into(public, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setattr("services.gateway.public_tls.RECHECK_S", 0.0)  # every call looks at the files
    ca, directory = public
    other = ca.issue(tmp_path / "other", ("gateway",))
    with pytest.raises(ValueError, match="tls_cert/tls_key: cannot load"):
        PublicTls(directory / "tls.crt", other / "tls.key")
    tls = PublicTls(directory / "tls.crt", directory / "tls.key")
    first = tls.current()
    (directory / "tls.key").write_bytes((other / "tls.key").read_bytes())  # a rotation caught half-way
    assert tls.current() is first and tls.generation == 0
    (directory / "tls.crt").write_bytes((other / "tls.crt").read_bytes())  # the rotation completes
    assert tls.current().cert == (other / "tls.crt").read_bytes() and tls.generation == 1


def handshake_serial(tls: PublicTls, ca_file: Path) -> int:
    """The serial of the certificate an in-memory TLS handshake against ``tls.ssl_context()`` presents (the
    SNI callback runs as it does for the HTTPS port; an error in it fails the handshake)."""
    client_context = ssl.create_default_context(cafile=str(ca_file))
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(to_client, to_server, server_hostname="127.0.0.1")
    server = tls.ssl_context().wrap_bio(to_server, to_client, server_side=True)
    done = {client: False, server: False}
    for _ in range(20):
        for end in (client, server):
            if not done[end]:
                try:
                    end.do_handshake()
                    done[end] = True
                except ssl.SSLWantReadError:
                    pass
        if all(done.values()):
            break
    assert all(done.values()), "the handshake did not finish"
    der = client.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_file_briefly_missing_keeps_the_last_good_pair_and_warns_once(public, tmp_path, monkeypatch):
    """A rotation that deletes the certificate before writing the new one: handshakes go on with the last
    good pair (no ``FileNotFoundError`` out of the SNI callback), one warning for the whole outage, and the
    new pair is taken once it is there."""
    monkeypatch.setattr("services.gateway.public_tls.RECHECK_S", 0.0)  # every call looks at the files
    ca, directory = public
    tls = PublicTls(directory / "tls.crt", directory / "tls.key")
    first, first_serial = tls.current(), cert_serial(directory)
    assert handshake_serial(tls, directory / "ca.crt") == first_serial
    (directory / "tls.crt").unlink()
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert tls.current() is first
            assert handshake_serial(tls, directory / "ca.crt") == first_serial
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1 and "cannot be read" in warnings[0]["event"], logs
    assert tls.generation == 0

    new = ca.issue(tmp_path / "new", ("gateway",), hosts=("127.0.0.1", "localhost"))
    (directory / "tls.key").write_bytes((new / "tls.key").read_bytes())  # the key first: a mismatched pair
    (directory / "tls.crt").write_bytes((new / "tls.crt").read_bytes())  # then the certificate: whole again
    with structlog.testing.capture_logs() as logs:
        assert tls.current().cert == (new / "tls.crt").read_bytes() and tls.generation == 1
    assert handshake_serial(tls, directory / "ca.crt") == cert_serial(new) != first_serial
    assert any(entry["event"] == "public TLS files readable again" for entry in logs), logs

    (directory / "tls.key").unlink()  # a later outage is warned about again
    with structlog.testing.capture_logs() as logs:
        assert tls.current().cert == (new / "tls.crt").read_bytes()
        assert tls.current().cert == (new / "tls.crt").read_bytes()
    assert [entry["log_level"] for entry in logs] == ["warning"], logs

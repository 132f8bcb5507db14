"""Finding a service's ephemeral port and waiting for it to be healthy (launchers and tests).

A service started with ``--listen 127.0.0.1:0 --port-file PATH`` binds an ephemeral port and writes it
to PATH (atomically) once its gRPC server runs; ``wait_for_port_file`` reads it back and
``wait_until_serving`` polls ``grpc.health.v1.Health/Check`` until the answer is SERVING, which is what
says it is ready (a model node loading its model, or a gateway binding its HTTP front, is NOT_SERVING).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.tls.channels import open_sync_channel
from services.common.tls.identity import Identity

POLL_S = 0.02


class StartupError(RuntimeError):
    """A service did not come up: it exited, or did not serve within the timeout."""


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (bound and released: another process may take it before the caller does;
    for what cannot bind port 0 and report it, such as a side port or a third-party server)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_for_port_file(path: Path, timeout_s: float = 10.0, process: subprocess.Popen | None = None) -> int:
    """The port written to ``path``; fails fast if ``process`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text().strip()
            if text.isdigit():
                return int(text)
        if process is not None and process.poll() is not None:
            raise StartupError(f"process exited with code {process.returncode} before writing {path}")
        time.sleep(POLL_S)
    raise StartupError(f"no port in {path} after {timeout_s:.1f}s")


def wait_until_serving(address: str, service: str = "", timeout_s: float = 10.0, role: str = "",
                       identity: Identity | bool | None = True) -> None:
    """Poll the health service of ``address`` until ``service`` ("" = the whole node) is SERVING; ``role``:
    the node's, to call it over mTLS with ``identity`` (True: this process's; see ``tls.channels``); empty:
    plaintext (the gateway's public port)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    channel = open_sync_channel(address, role, identity=identity) if role else grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
            except grpc.RpcError as error:
                last = f"{error.code().name}: {error.details()}"
            else:
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            time.sleep(POLL_S)
    raise StartupError(f"{address} service {service!r} not SERVING after {timeout_s:.1f}s ({last})")

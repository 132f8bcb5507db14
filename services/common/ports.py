"""Finding a service's ephemeral port and waiting for it to be healthy (launchers and tests).

A service started with ``--listen 127.0.0.1:0 --port-file PATH`` binds an ephemeral port and writes it
to PATH (atomically) once its gRPC server runs; ``wait_for_port_file`` reads it back and
``wait_until_serving`` polls ``grpc.health.v1.Health/Check`` until the answer is SERVING, which is what
says it is ready (a model node loading its model, or a gateway binding its HTTP front, is NOT_SERVING).
"""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.tls.channels import open_sync_channel
from services.common.tls.identity import Identity

POLL_S = 0.02


# Linux's default ephemeral range (where bind(port 0) and outgoing connections take their local ports), for
# systems that do not say theirs
DEFAULT_EPHEMERAL = (32768, 60999)
_CHOSEN_FROM = (10000, 65535)  # a chosen port comes from here, less the ephemeral range


class StartupError(RuntimeError):
    """A service did not come up: it exited, or did not serve within the timeout."""


class PortTaken(StartupError):
    """A service given a port in advance exited before serving, and the port is now someone else's: another
    process bound it between :func:`unused_port` and the service's own bind. Starting again, with another
    port, is the remedy."""


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


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux: ``ip_local_port_range``; elsewhere Linux's default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def unused_port(host: str = "127.0.0.1", attempts: int = 100, avoid: Collection[int] = ()) -> int:
    """A port free on ``host`` now, chosen at random outside the ephemeral range (and not in ``avoid``: those a
    launcher chose already for services not bound yet), for a service that should be reachable before it has
    bound (a launcher passes it to the service and to its peers at once).

    Outside the ephemeral range no port 0 bind and no outgoing connection takes it meanwhile; only another
    process that chose the same port could (the service then fails to bind: :class:`PortTaken`). Falls back to
    :func:`free_port` when the ephemeral range leaves no room."""
    low, high = ephemeral_range()
    below = range(_CHOSEN_FROM[0], min(low, _CHOSEN_FROM[1] + 1))
    above = range(max(high + 1, _CHOSEN_FROM[0]), _CHOSEN_FROM[1] + 1)
    room = len(below) + len(above)
    chooser = random.SystemRandom()
    for _ in range(attempts if room else 0):
        pick = chooser.randrange(room)  # uniform over both ranges together
        port = below[pick] if pick < len(below) else above[pick - len(below)]
        if port not in avoid and port_is_free(host, port):
            return port
    return free_port(host)


def port_is_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` now (as a gRPC server binds: with ``SO_REUSEADDR``)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


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

"""The small extra ports a ``NodeServer`` may open beside its main one.

- the *health port* (``--health-listen``): plaintext, ``grpc.health.v1`` only — what a Kubernetes gRPC
  probe can reach, since a probe cannot present a certificate. It serves the main server's health
  servicer, so it says what the main port says.
- the *admin port* (``--admin-listen``, the gateway): ``Admin`` and health, with the cluster's mTLS and
  the admin role check — the gateway's main port is public and never serves ``Admin``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio

Adder = Callable[[grpc.aio.Server], None]


async def start_side_port(listen: str, adders: Sequence[Adder], credentials: grpc.ServerCredentials | None,
                          interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                          options: Sequence[tuple[str, Any]] = ()) -> tuple[grpc.aio.Server, int]:
    """A started server on ``listen`` (plaintext when ``credentials`` is None) with what ``adders``
    register; returns it and its bound port; ``OSError`` naming ``listen`` when it cannot bind."""
    server = grpc.aio.server(options=[*options, ("grpc.so_reuseport", 0)], interceptors=list(interceptors))
    for add in adders:
        add(server)
    try:
        port = (server.add_secure_port(listen, credentials) if credentials is not None
                else server.add_insecure_port(listen))
    except RuntimeError as error:
        port, reason = 0, str(error)
    else:
        reason = ""
    if port == 0:
        await server.stop(None)
        raise OSError(f"cannot bind {listen}{': ' + reason if reason else ''}")
    await server.start()
    return server, port

"""Server credentials that follow certificate files re-read on change (``Identity``, the gateway's
``PublicTls``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

T = TypeVar("T")


def following_credentials(current: Callable[[], T], configuration: Callable[[T], grpc.ServerCertificateConfiguration],
                          require_client_auth: bool) -> grpc.ServerCredentials:
    """gRPC dynamic SSL credentials over ``current()`` (the last good reading of the files, the same object
    until they change): at each new handshake gRPC asks, and gets ``configuration`` of a new reading, or
    None (no change). Connections already open keep what they began with."""
    issued = [current()]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        reading = current()
        if reading is issued[0]:
            return None
        issued[0] = reading
        return configuration(reading)

    return grpc.dynamic_ssl_server_credentials(configuration(issued[0]), fetch,
                                               require_client_authentication=require_client_auth)

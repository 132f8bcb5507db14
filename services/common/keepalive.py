"""HTTP/2 keepalive on every pdserve channel and server, so a hung peer fails its calls.

A peer that died closes its TCP connections, and calls on them fail at once. A peer that hangs (stopped,
wedged, its host unreachable) keeps them open: without pings, a call to it would wait until its
deadline, and a call without one forever. With keepalive, an endpoint that has calls in flight pings its
peer every ``time_s``; no answer within ``timeout_s`` closes the connection, and its calls fail
``UNAVAILABLE`` (the gateway then reports the node and the reason; the nodes free what the calls held).

Servers accept pings from peers as often as once a second and never send ``GOAWAY: too_many_pings``,
so a client with a shorter interval than this process's is still served. Set once per process by its
``main`` (``--keepalive-s``, ``--keepalive-timeout-s``); :func:`options` is read when a channel or server is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Keepalive:
    time_s: float = 10.0  # 0 = no pings
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.time_s < 0 or self.timeout_s <= 0:
            raise ValueError(f"keepalive_s must be >= 0 and keepalive_timeout_s > 0, got {self}")


_current = Keepalive()


def set_keepalive(time_s: float, timeout_s: float) -> None:
    """This process's keepalive, for the channels and servers made from now on."""
    global _current
    _current = Keepalive(time_s, timeout_s)


def current() -> Keepalive:
    """This process's keepalive."""
    return _current


def options() -> list[tuple[str, Any]]:
    """gRPC channel/server arguments for the current keepalive."""
    accept = [("grpc.http2.min_recv_ping_interval_without_data_ms", 1000), ("grpc.http2.max_ping_strikes", 0)]
    if _current.time_s == 0:
        return accept
    return [
        ("grpc.keepalive_time_ms", int(_current.time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(_current.timeout_s * 1000)),
        # grpcio 1.85 times an unanswered keepalive ping out by this one (default 60 s), not the one above
        ("grpc.http2.ping_timeout_ms", int(_current.timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 0),  # idle channels stay quiet
        ("grpc.http2.max_pings_without_data", 0),  # a stream waiting for its first token still pings
        *accept,
    ]

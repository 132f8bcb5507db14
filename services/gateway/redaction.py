"""What a client reads names no internal address: node addresses in error texts become ``[internal]``.

A failure deep in the cluster reaches the client as a status message built from node errors ("decode node
10.0.3.7:50051 failed: UNAVAILABLE: ipv4:10.0.3.7:50051: Connection refused"). Those addresses map the
private network for whoever sends requests, so the gateway's public answers (gRPC statuses and the HTTP
front's errors) carry the text with every ``host:port`` replaced; the gateway's own log lines keep them
(``request_flow`` logs the failed node's address with the request id).

Recognised, each with a port: IPv4 ``a.b.c.d``; IPv6 bracketed ``[::1]``, percent-encoded as gRPC writes it
in its own errors (``ipv6:%5B::1%5D:port``) and bare (``fd00::7:port``, or all eight groups); dotted host
names, ``localhost``, and lowercase single-label names (``decode-0:50051``, a Kubernetes or Compose service)
with a port of four or five digits; and gRPC's ``ipv4:``/``ipv6:``/``dns:///`` target prefixes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from services.common.errors import mapped_errors

PLACEHOLDER = "[internal]"
# Every run is bounded and every bare form starts at a boundary, so a match attempt costs O(1) per position:
# error texts carry client input (a grammar's line, up to 64 KiB), and unbounded nested runs backtracked
# cubically (4,000 colons took 99 s on the event loop).
_HEX = r"[0-9A-Fa-f]{1,4}"
_IPV6 = (rf"(?<![0-9A-Fa-f:])(?:(?:{_HEX}(?::{_HEX}){{0,6}})?::(?:{_HEX}(?::{_HEX}){{0,6}})?"
         rf"|(?:{_HEX}:){{7}}{_HEX})")
_HOST = (r"(?:\[[0-9A-Fa-f:.]{2,45}\]|%5B[0-9A-Fa-f:.]{2,45}%5D|(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}|localhost"
         rf"|(?<![A-Za-z0-9.-])[A-Za-z0-9-]{{1,63}}(?:\.[A-Za-z0-9-]{{1,63}}){{1,10}}|{_IPV6})")
_LABEL = r"(?<![\w.%:~-])[a-z][a-z0-9-]{0,62}"  # a lowercase DNS label (RFC 1123) standing alone
# a single label only with a port of 4 or 5 digits: "seq:50" or "attempt:12" are not addresses
_ADDRESS = re.compile(rf"(?:ipv4:|ipv6:|dns:/{{0,3}})?(?:{_HOST}:\d{{1,5}}|{_LABEL}:\d{{4,5}})\b")


def redact_addresses(text: str) -> str:
    return _ADDRESS.sub(PLACEHOLDER, text)


def redacted(error: BaseException) -> BaseException:
    """``error`` with its message's addresses replaced (errors whose text is their first argument)."""
    if error.args and isinstance(error.args[0], str):
        error.args = (redact_addresses(error.args[0]), *error.args[1:])
    return error


def redact_stream_errors(method: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """Decorate a streaming servicer method (under ``@grpc_errors``): a mapped error it raises leaves with
    its addresses redacted."""

    @functools.wraps(method)
    async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        try:
            async for item in method(*args, **kwargs):
                yield item
        except mapped_errors() as error:
            redacted(error)
            raise

    return stream

"""What a client reads names no internal address: node addresses in error texts become ``[internal]``.

A failure deep in the cluster reaches the client as a status message built from node errors ("decode node
10.0.3.7:50051 failed: UNAVAILABLE: ipv4:10.0.3.7:50051: Connection refused"). Those addresses map the
private network for whoever sends requests, so the gateway's public answers (gRPC statuses and the HTTP
front's errors) carry the text with every ``host:port`` replaced; the gateway's own log lines keep them
(``request_flow`` logs the failed node's address with the request id).

Recognised: IPv4 ``a.b.c.d:port``, bracketed IPv6 ``[::1]:port``, dotted host names and ``localhost`` with a
port, and gRPC's ``ipv4:``/``ipv6:``/``dns:///`` target prefixes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from services.common.errors import mapped_errors

PLACEHOLDER = "[internal]"
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|\d{1,3}(?:\.\d{1,3}){3}|localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)"
_ADDRESS = re.compile(rf"(?:ipv4:|ipv6:|dns:/{{0,3}})?{_HOST}:\d{{1,5}}\b")


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

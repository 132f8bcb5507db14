"""Requests that do not parse get ``INVALID_ARGUMENT``, not grpc.aio's ``UNKNOWN``.

grpc.aio deserializes a request before any handler runs, and a ``DecodeError`` there (bytes that are
not the method's message: a string field with bad UTF-8, a corrupt wire format) ends the call with
``UNKNOWN: Unexpected <class 'DecodeError'>``. ``TolerantParsing`` gives every pdserve method with a unary
request a deserializer that returns an ``UnparsableRequest`` instead of raising; ``@grpc_errors``, on
every such handler, aborts it with ``INVALID_ARGUMENT`` naming the message type and the parse error.
Streamed requests keep their deserializers: the cache-store's ``Put`` parses its own frames, and the
decode node's ``TransferKV`` turns a ``DecodeError`` raised while it reads its stream into
``INVALID_ARGUMENT``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

PDSERVE_METHODS = "/pdserve.v1."


@dataclass(frozen=True)
class UnparsableRequest:
    """What a handler receives in place of a request whose bytes did not parse."""

    method: str
    error: str

    @property
    def message(self) -> str:
        return f"request: the bytes sent to {self.method} are not a valid request message ({self.error})"


def _tolerant(deserializer: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:  # DecodeError, or whatever else a parser raises on bad bytes
            return UnparsableRequest(method, str(error) or type(error).__name__)

    return parse


class TolerantParsing(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if (handler is None or handler.request_streaming or handler.request_deserializer is None
                or not method.startswith(PDSERVE_METHODS)):
            return handler
        return handler._replace(request_deserializer=_tolerant(handler.request_deserializer, method))  # type: ignore[attr-defined]

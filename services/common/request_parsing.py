"""Requests that do not parse get ``INVALID_ARGUMENT``, not grpc.aio's ``UNKNOWN``.

grpc.aio deserializes a request before any handler runs, and a ``DecodeError`` there (bytes that are
not the method's message: a string field with bad UTF-8, a corrupt wire format) ends the call with
``UNKNOWN: Unexpected <class 'DecodeError'>``. ``TolerantParsing`` gives every method with a unary request
whose handler refuses unparsable requests (``@grpc_errors`` marks its wrappers so, and aborts such a call
with ``INVALID_ARGUMENT`` naming the method and the parse error) a deserializer that returns an
``UnparsableRequest`` instead of raising. Any other handler keeps grpc's deserializer: it never receives
what it cannot read.
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

REFUSES_UNPARSABLE = "__pdserve_refuses_unparsable__"  # set on a handler that checks for UnparsableRequest
# set on a method under @grpc_errors that takes an UnparsableRequest itself and raises its error() (the
# gateway's metrics, to count the refusal)
RAISES_UNPARSABLE = "__pdserve_raises_unparsable__"


@dataclass(frozen=True)
class UnparsableRequest:
    """What a handler receives in place of a request whose bytes did not parse."""

    method: str
    error: str

    @property
    def reason(self) -> str:
        return f"the bytes sent to {self.method} are not a valid request message ({self.error})"

    @property
    def message(self) -> str:
        return f"request: {self.reason}"

    def refusal(self) -> Exception:
        """The ``InvalidArgumentError`` that refuses it (its text is :attr:`message`)."""
        from services.common.errors import InvalidArgumentError  # errors imports this module

        return InvalidArgumentError("request", self.reason)


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
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        if not getattr(behavior, REFUSES_UNPARSABLE, False):
            return handler
        tolerant = _tolerant(handler.request_deserializer, handler_call_details.method)
        return handler._replace(request_deserializer=tolerant)  # type: ignore[attr-defined]

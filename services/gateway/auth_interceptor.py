"""gRPC API-key check of the gateway's port: ``authorization: Bearer <key>`` metadata on every call.

Services named open (default: ``grpc.health.v1.Health`` and server reflection, so probes and ``grpcurl
list`` work without a key) pass unchecked; everything else needs a key. ``Admin`` is not on this port at all
(a call there is ``UNIMPLEMENTED``): the gateway serves it on ``--admin-listen``, to admin certificates only.
A call without one ends ``UNAUTHENTICATED`` "missing API key", one with a key that is not configured
"invalid API key" — before its request is read, and without echoing what was sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from services.gateway.api_keys import MISSING, ApiKeys, bearer

# the short names --api-key-open-services accepts, and the services each stands for
OPEN_SERVICE_NAMES: dict[str, tuple[str, ...]] = {
    "health": (health.SERVICE_NAME,),
    "reflection": (reflection.SERVICE_NAME, "grpc.reflection.v1.ServerReflection"),
}
MESSAGES = {MISSING: "missing API key: send the metadata 'authorization: Bearer <key>'",
            "invalid": "invalid API key"}


def open_services(names: Iterable[str]) -> frozenset[str]:
    """``["health", "reflection"]`` → the full service names; a full name (``pdserve.v1.Admin``) is
    kept as it is; ``ValueError`` for an empty one."""
    services: set[str] = set()
    for name in names:
        if not name:
            raise ValueError("api_key_open_services: an empty service name")
        services.update(OPEN_SERVICE_NAMES.get(name, (name,)))
    return frozenset(services)


def _metadata_key(metadata: Any) -> str | None:
    for name, value in metadata or ():
        if name == "authorization":
            return bearer(value if isinstance(value, str) else value.decode(errors="replace"))
    return None


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that ends the call ``UNAUTHENTICATED``."""

    async def refuse(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: ApiKeys, open_to_all: frozenset[str]) -> None:
        """``open_to_all``: full service names served without a key."""
        self.keys = keys
        self.open_to_all = open_to_all

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        service = handler_call_details.method.lstrip("/").partition("/")[0]
        if handler is None or service in self.open_to_all:
            return handler  # an unknown method stays UNIMPLEMENTED
        problem = self.keys.check(_metadata_key(handler_call_details.invocation_metadata))
        if problem is None:
            return handler
        return _refusal(handler, MESSAGES[problem])

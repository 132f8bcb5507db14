"""Named errors that servicers turn into gRPC status codes.

Core code raises a ``ServiceError`` subclass (or an error type registered with ``map_error``); a
servicer method decorated with ``@grpc_errors`` aborts the call with the error's status code and a
message that names the problem. Nothing else is caught: any other exception is a bug and reaches
grpc as one (``UNKNOWN``), with its traceback in the log.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from services.common.cancellation import close_on_rpc_end
from services.common.request_parsing import RAISES_UNPARSABLE, REFUSES_UNPARSABLE, UnparsableRequest


class ServiceError(Exception):
    """Base of the errors a servicer maps to a status code: ``code`` says which."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgumentError(ServiceError):
    """A request field is malformed; the message starts with the field's name."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class ResourceExhaustedError(ServiceError):
    """No capacity for the request now (no free blocks, store full); retrying later may work."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(ServiceError):
    """The node is draining or a peer it needs did not answer."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(ServiceError):
    """The request's deadline passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(ServiceError):
    """The request or key named does not exist here (never existed, finished, expired or evicted)."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPreconditionError(ServiceError):
    """The request is well-formed but does not fit this node (another model, another block size)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class DataLossError(ServiceError):
    """Received data is truncated or does not match its checksum."""

    code = grpc.StatusCode.DATA_LOSS


_MAPPED: dict[type[Exception], grpc.StatusCode] = {ServiceError: grpc.StatusCode.INTERNAL}


def map_error(error_type: type[Exception], code: grpc.StatusCode) -> None:
    """Register a named error of another package (the engine's, kvcache's) as mapping to ``code``."""
    _MAPPED[error_type] = code


def status_of(error: Exception) -> grpc.StatusCode:
    """The status code of a mapped error: its own ``code``, else the nearest registered base class."""
    if isinstance(error, ServiceError):
        return error.code
    for base in type(error).__mro__:
        if base in _MAPPED:
            return _MAPPED[base]
    raise TypeError(f"{type(error).__name__} is not a mapped error")


def mapped_errors() -> tuple[type[Exception], ...]:
    return tuple(_MAPPED)


F = TypeVar("F", bound=Callable[..., Any])


def grpc_errors(method: F) -> F:
    """Decorate an async servicer method (unary or server-streaming) so mapped errors abort the call.

    ``context.abort`` raises, so the handler ends there; the status message is ``str(error)``. A request
    that did not parse (``UnparsableRequest``, see ``request_parsing``) is refused with ``INVALID_ARGUMENT``
    before the method runs (or by the method, which raises ``request.refusal()``, when it is marked
    ``RAISES_UNPARSABLE``).
    """
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, UnparsableRequest) and not getattr(method, RAISES_UNPARSABLE, False):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            try:  # closed when the RPC ends, or its cleanup may wait for the garbage collector
                async with contextlib.aclosing(close_on_rpc_end(context, method(self, request, context))) as items:
                    async for item in items:
                        yield item
            except mapped_errors() as error:
                await context.abort(status_of(error), str(error))

        setattr(stream, REFUSES_UNPARSABLE, True)
        return stream  # type: ignore[return-value]

    if not inspect.iscoroutinefunction(method):
        raise TypeError(f"@grpc_errors needs an async method, got {method!r}")

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, UnparsableRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            return await method(self, request, context)
        except mapped_errors() as error:
            await context.abort(status_of(error), str(error))

    setattr(unary, REFUSES_UNPARSABLE, True)
    return unary  # type: ignore[return-value]

"""Awaiting work that must not stop half-way when its caller is cancelled; closing a streaming handler's
generators when its RPC ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from typing import Any, TypeVar

import structlog

T = TypeVar("T")
log = structlog.get_logger(__name__)
_closing: set[asyncio.Task[None]] = set()  # close tasks in flight (the loop keeps only weak references)


async def uncancellable(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the caller is cancelled meanwhile, once or more (then
    ``CancelledError`` follows once it ended): for cleanups that must not stop half-way, such as freeing
    blocks a thread still writes, or a request's cleanup that both gRPC and an ``Abort`` cancel."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():  # the work itself was cancelled, not only its caller
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


def close_on_rpc_end(context: Any, generator: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    """Close ``generator`` (a server-streaming handler's) once its RPC ends; returns it.

    grpc.aio does not close a handler's async generator when the call ends while the handler waits for
    a message to be sent (the client cancelled, a deadline passed, the peer went away): the generator
    stays suspended at its ``yield``, and its ``finally`` blocks — a request's cleanup — run only when it is
    garbage-collected, which a reference from a live object can put off forever. A generator that is
    running when the RPC ends is being cancelled in its task, which runs its cleanup; one that finished
    has nothing left to close. Each wrapping generator must close the one it iterates
    (``contextlib.aclosing``) for the close to reach the innermost."""

    async def close() -> None:
        try:
            await generator.aclose()
        except RuntimeError as error:
            if "already running" not in str(error):  # running: the handler's cancelled task ends it
                log.error("closing a streaming handler after its RPC ended failed", error=repr(error))
        except Exception as error:  # a cleanup that failed: nobody else would hear of it
            log.error("closing a streaming handler after its RPC ended failed", error=repr(error))

    def on_done(_: object) -> None:
        task = asyncio.ensure_future(close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    context.add_done_callback(on_done)
    return generator

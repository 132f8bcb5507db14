"""Awaiting work that must not stop half-way when its caller is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


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

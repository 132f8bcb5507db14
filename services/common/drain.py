"""How a node that runs the model drains: how long it waits for its requests, and how it ends the rest."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection

import structlog

log = structlog.get_logger(__name__)

ENDING_MARGIN_S = 2.0


async def drain_requests(role: str, left: Callable[[], Collection[str]],
                         end: Callable[[str, str], Awaitable[object]], wait_s: float) -> None:
    """A draining node's requests: wait up to ``wait_s`` for ``left()`` to empty, then ``end(request_id,
    reason)`` the rest concurrently, with a reason their clients read; one that fails is logged, not raised
    (the others still end)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while left() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    reason = f"the {role} node is draining and stopped waiting for the request after {wait_s:g} s"
    ended = await asyncio.gather(*(end(request_id, reason) for request_id in list(left())), return_exceptions=True)
    for error in (e for e in ended if isinstance(e, BaseException)):
        log.error("a drained request could not be ended", error=repr(error))


def drain_wait_s(drain_timeout_s: float) -> float:
    """How long a draining node waits for its requests before it ends the rest with a reason its clients
    read. ``NodeServer`` cuts the whole drain at ``drain_timeout_s``; the ending gets the last part of it
    (2 s, or a quarter of a shorter timeout), so it is not cut short itself."""
    return max(0.0, drain_timeout_s - min(ENDING_MARGIN_S, drain_timeout_s / 4))

"""The requests this prefill node is working on, by id, so that an ``Abort`` answers only once the request
is gone everywhere it went.

A request's cleanup (closing its KV stream, freeing its blocks here, aborting its reservation on the
decode node) runs in its ``Prefill`` call after that call is cancelled, and takes a few awaits. An
``Abort`` that answered at once would let the gateway free the request id while that cleanup still ran:
a client reusing the id then met the old request on this node or on the decode node ("already running",
or a decode node dropped as failing). So :meth:`LiveRequests.end` cancels the request's call if it still
runs and returns once its cleanup is done, and :meth:`LiveRequests.enter` makes a new request with the
id of one that is ending wait for that (a request whose id is in use and not ending is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import structlog

from services.common.errors import UnavailableError
from services.engine.errors import DuplicateRequestError

log = structlog.get_logger(__name__)


@dataclass
class LiveRequest:
    task: asyncio.Task  # the Prefill call's task
    done: asyncio.Event = field(default_factory=asyncio.Event)  # its cleanup finished
    ending: bool = False  # finished, failed or cancelled here: a reuse of its id waits for its cleanup
    ended_by: str | None = None  # why this node ended it (drain): its call fails UNAVAILABLE with this


class LiveRequests:
    def __init__(self, settle_timeout_s: float = 10.0):
        """``settle_timeout_s``: the longest an ``Abort`` or a reusing request waits for a cleanup."""
        self.settle_timeout_s = settle_timeout_s
        self._live: dict[str, LiveRequest] = {}

    def __len__(self) -> int:
        return len(self._live)

    def ids(self) -> list[str]:
        return list(self._live)

    def unended(self) -> list[str]:
        """The requests neither finished, failed nor being ended here."""
        return [rid for rid, live in self._live.items() if not live.ending]

    async def enter(self, request_id: str) -> LiveRequest:
        """Register the calling task's request; waits for an ending one with the same id to finish."""
        while (old := self._live.get(request_id)) is not None:  # again after a wait: another may have won
            if not old.ending:
                raise DuplicateRequestError(request_id)
            if not await self._settled(old):
                raise UnavailableError(f"request {request_id!r}: the earlier request with this id is still "
                                       f"ending here after {self.settle_timeout_s:g} s")
        task = asyncio.current_task()
        assert task is not None, "enter() runs in the request's task"
        live = self._live[request_id] = LiveRequest(task)
        return live

    def leave(self, request_id: str, live: LiveRequest) -> None:
        """The request's cleanup is done."""
        if self._live.get(request_id) is live:
            del self._live[request_id]
        live.done.set()

    async def end(self, request_id: str, reason: str | None = None) -> bool:
        """Cancel the request's call unless it is already ending; return (True) once its cleanup is done,
        or after ``settle_timeout_s``. False: no such request here. With ``reason`` (this node ends it, no
        caller asked) the call fails ``UNAVAILABLE`` with that reason instead of being cancelled."""
        live = self._live.get(request_id)
        if live is None:
            return False
        if not live.ending:
            live.ending = True
            live.ended_by = reason
            live.task.cancel()  # its cleanup runs uncancellable(): a cancel that gRPC also sent cuts nothing
        if not await self._settled(live):
            log.warning("abort answered before the request's cleanup ended", request_id=request_id,
                        waited_s=self.settle_timeout_s)
        return True

    async def _settled(self, live: LiveRequest) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(live.done.wait()), self.settle_timeout_s)
        return live.done.is_set()


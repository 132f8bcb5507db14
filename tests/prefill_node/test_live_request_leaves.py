"""A prefill request leaves the node's live requests however its call ends, even when a cancel lands
while its last cleanup step waits (``uncancellable`` raises that cancel once the step is done). Before,
the request then stayed "live" for good: a 7-minute soak left prefill nodes whose drain waited for such
requests until they were killed. The node's own ``prefill`` generator, on a stand-in for its parts."""

from __future__ import annotations

import asyncio

import pytest

from services.prefill_node.live_requests import LiveRequests
from services.prefill_node.node import PrefillNode


class Prepare:
    """``settled`` waits until released, so a cancel can land while the request's cleanup waits on it."""

    def __init__(self) -> None:
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def settled(self, request_id: str) -> None:
        self.entered.set()
        await self.release.wait()


class Parts:
    def __init__(self) -> None:
        self.live = LiveRequests(settle_timeout_s=1.0)
        self.prepare = Prepare()

    def refuse_if_closed(self) -> None:
        pass  # neither failed nor draining

    async def _prefill(self, live, request_id, prompt_ids, sampling, candidates, timeout_s):
        yield "first token"  # the request's work, done


async def test_a_cancel_during_the_last_cleanup_step_still_lets_the_request_leave():
    parts = Parts()

    async def call() -> list[str]:
        return [event async for event in PrefillNode.prefill(parts, "r1", [1, 2], None, ["d"], None)]

    task = asyncio.ensure_future(call())
    await asyncio.wait_for(parts.prepare.entered.wait(), 5)
    assert parts.live.ids() == ["r1"]
    task.cancel()  # the client's cancel (or a drain's) arrives now
    await asyncio.sleep(0.01)
    parts.prepare.release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert parts.live.ids() == [] and len(parts.live) == 0

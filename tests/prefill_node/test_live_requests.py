"""LiveRequests without a model: an Abort waits for the request's cleanup, a request reusing the id of an
ending one waits for it, one reusing a running id is refused — also when two reusers wait on one id."""

from __future__ import annotations

import asyncio

import pytest

from services.engine.errors import DuplicateRequestError
from services.prefill_node.live_requests import LiveRequests


async def request(live: LiveRequests, request_id: str, log: list[str], name: str, cleanup_s: float = 0.05,
                  entered: asyncio.Event | None = None) -> None:
    """A Prefill call: registered, runs until cancelled, then cleans up for ``cleanup_s``."""
    entry = await live.enter(request_id)
    log.append(f"{name} entered")
    if entered is not None:
        entered.set()
    try:
        await asyncio.Event().wait()
    finally:
        entry.ending = True
        await asyncio.sleep(cleanup_s)
        log.append(f"{name} cleaned up")
        live.leave(request_id, entry)


async def test_an_abort_cancels_the_request_and_answers_after_its_cleanup():
    live, log, entered = LiveRequests(), [], asyncio.Event()
    task = asyncio.ensure_future(request(live, "r", log, "first", entered=entered))
    await entered.wait()
    assert await live.end("r")
    assert log == ["first entered", "first cleaned up"] and task.cancelled() and len(live) == 0
    assert not await live.end("r")  # gone


async def test_a_running_id_is_refused_and_an_ending_one_is_waited_for():
    live, log, entered = LiveRequests(), [], asyncio.Event()
    first = asyncio.ensure_future(request(live, "r", log, "first", entered=entered))
    await entered.wait()
    with pytest.raises(DuplicateRequestError):
        await live.enter("r")
    first.cancel()  # its cleanup is under way (gRPC cancelled the call): it is ending
    await asyncio.sleep(0)
    second_entered = asyncio.Event()
    second = asyncio.ensure_future(request(live, "r", log, "second", entered=second_entered))
    await second_entered.wait()
    assert log == ["first entered", "first cleaned up", "second entered"]
    await live.end("r")
    await asyncio.gather(first, second, return_exceptions=True)


async def test_of_two_requests_waiting_on_one_ending_id_one_enters_and_the_other_is_refused():
    live, log, entered = LiveRequests(), [], asyncio.Event()
    first = asyncio.ensure_future(request(live, "r", log, "first", entered=entered))
    await entered.wait()
    first.cancel()
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(request(live, "r", log, name)) for name in ("second", "third")]
    await asyncio.sleep(0.1)
    outcomes = [w.exception() if w.done() else None for w in waiting]
    assert [type(o) for o in outcomes].count(DuplicateRequestError) == 1, outcomes
    assert log.count("second entered") + log.count("third entered") == 1
    await live.end("r")
    await asyncio.gather(first, *waiting, return_exceptions=True)
    assert len(live) == 0

"""uncancellable(): the work runs to its end however often its caller is cancelled; the caller then
sees one CancelledError."""

from __future__ import annotations

import asyncio

import pytest

from services.common.cancellation import uncancellable


async def test_the_work_ends_although_its_caller_is_cancelled_twice():
    steps: list[str] = []

    async def clean_up() -> None:
        steps.append("started")
        await asyncio.sleep(0.05)
        steps.append("ended")

    caller = asyncio.ensure_future(uncancellable(clean_up()))
    await asyncio.sleep(0.01)
    caller.cancel()  # gRPC cancels the call …
    await asyncio.sleep(0.01)
    caller.cancel()  # … and an Abort cancels it again
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert steps == ["started", "ended"]


async def test_without_a_cancel_it_returns_the_result_and_raises_the_work_s_error():
    async def answer() -> int:
        return 42

    async def fail() -> None:
        raise ValueError("broken")

    assert await uncancellable(answer()) == 42
    with pytest.raises(ValueError, match="broken"):
        await uncancellable(fail())

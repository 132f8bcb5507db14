"""A node whose drain timeout runs out ends the requests left with a reason their callers read, and frees
everything they held on both nodes. A prefill node and a decode node in one process, real gRPC, a tiny
random model on the CPU."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from services.common.drain import drain_wait_s
from services.common.errors import UnavailableError
from services.prefill_node.node import FirstToken, Reserved
from tests.prefill_node.node_pair import GREEDY, PROMPT, idle, pair, slow_steps

LEASE_S = 30.0  # nothing here is freed by a lease


async def test_a_prefill_node_ends_a_request_still_prefilling_when_its_drain_runs_out(model):
    async with pair(model, LEASE_S) as (prefill, decode, address):
        slow_steps(prefill, 0.5)  # three chunks: 1.5 s of prefill
        reserved = asyncio.Event()

        async def call() -> None:
            async for event in prefill.prefill("drained", PROMPT, GREEDY, [address], timeout_s=30):
                if isinstance(event, Reserved):
                    reserved.set()

        task = asyncio.ensure_future(call())
        await reserved.wait()
        while not await prefill.worker.call(lambda engine: engine.kv.has_request("drained")):  # started here
            await asyncio.sleep(0.01)
        await prefill.drain(0.2)
        ending = r"prefill node is draining and stopped waiting for the request after 0\.2 s"
        with pytest.raises(UnavailableError, match=ending):
            await task
        assert not prefill.engine.kv.has_request("drained") and len(prefill.live) == 0
        await idle(decode)  # its reservation there was aborted


async def test_a_prefill_node_ends_a_request_not_started_at_once_and_leaves_its_reservation_to_the_gateway(model):
    async with pair(model, 2.0) as (prefill, decode, address):
        slow_steps(prefill, 0.5)
        reserved = asyncio.Event()

        async def call() -> None:
            async for event in prefill.prefill("queued", PROMPT, GREEDY, [address], timeout_s=30):
                if isinstance(event, Reserved):
                    reserved.set()

        task = asyncio.ensure_future(call())
        await reserved.wait()  # not admitted to the engine yet, or queued there: not started
        assert not await prefill.worker.call(lambda engine: engine.kv.has_request("queued"))
        await prefill.drain(30.0)  # returns at once: nothing was left to wait for
        with pytest.raises(UnavailableError, match="the prefill node is draining and had not started it"):
            await task
        assert len(prefill.live) == 0 and not prefill.engine.holds("queued")
        assert "queued" in decode.engine.reservations.reservations, "left to the gateway, which aborts it"
        for _ in range(500):  # no gateway here: the reservation's lease ends it
            if not await decode.worker.call(lambda engine: bool(engine.reservations.reservations)):
                break
            await asyncio.sleep(0.02)
        await idle(decode)


async def test_a_decode_node_ends_a_request_still_decoding_when_its_drain_runs_out(model):
    async with pair(model, LEASE_S) as (prefill, decode, address):
        sampling = dataclasses.replace(GREEDY, max_tokens=200)
        events = [e async for e in prefill.prefill("drained", PROMPT, sampling, [address], timeout_s=30)]
        assert any(isinstance(e, FirstToken) for e in events)
        slow_steps(decode, 0.05)  # 200 tokens: 10 s
        received = []

        async def read() -> None:
            async for event in decode.attach("drained"):
                received.append(event)

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.3)
        await decode.drain(0.2)
        await reader
        last = received[-1]
        assert last.finish_reason == "abort"
        assert last.abort_reason == "the decode node is draining and stopped waiting for the request after 0.2 s"
        await idle(decode)


@pytest.mark.parametrize(("timeout_s", "wait_s"), [(30.0, 28.0), (4.0, 3.0), (2.0, 1.5), (0.0, 0.0)])
def test_a_node_waits_for_its_requests_and_keeps_the_end_of_its_drain_to_end_the_rest(timeout_s, wait_s):
    assert drain_wait_s(timeout_s) == wait_s

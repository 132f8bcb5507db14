"""An Abort on the prefill node answers only once the request is gone there and on its decode node, so a
client may reuse the id at once; a request whose id is still running is refused. A prefill node and a
decode node in one process, real gRPC, a tiny random model on the CPU."""

from __future__ import annotations

import asyncio

import pytest

from services.engine.errors import DuplicateRequestError
from services.prefill_node.node import PrefillNode, Reserved
from tests.prefill_node.node_pair import GREEDY, PROMPT, generate, idle, pair, slow_steps

LEASE_S = 30.0  # nothing here is freed by a lease


async def started(prefill: PrefillNode, address: str, request_id: str, keep_reading: bool = False
                  ) -> asyncio.Task:
    """A Prefill call in its own task (as the gRPC server runs it), once its reservation is granted; its
    reader stops there (the request goes no further) unless ``keep_reading``."""
    reserved = asyncio.Event()

    async def call() -> None:
        async for event in prefill.prefill(request_id, PROMPT, GREEDY, [address], timeout_s=30):
            if isinstance(event, Reserved):
                reserved.set()
                if not keep_reading:
                    await asyncio.Event().wait()

    task = asyncio.ensure_future(call())
    await reserved.wait()
    return task


def holds(decode, request_id: str) -> bool:
    engine = decode.engine
    return request_id in engine.reservations.reservations or engine.kv.has_request(request_id)


@pytest.mark.parametrize("mid_step", [False, True], ids=["between steps", "while its prefill step runs"])
@pytest.mark.parametrize("cancelled_first", [True, False], ids=["call cancelled, then Abort", "Abort alone"])
async def test_an_abort_answers_once_the_request_is_gone_and_the_id_is_free_again(model, expected,
                                                                                  cancelled_first, mid_step):
    async with pair(model, LEASE_S) as (prefill, decode, address):
        if mid_step:  # the engine lets go of a request in a running step only once that step ended
            slow_steps(prefill, 0.5)
        call = await started(prefill, address, "reused", keep_reading=mid_step)
        if mid_step:
            await asyncio.sleep(0.2)
            assert "reused" in prefill.engine._in_flight
        assert holds(decode, "reused")
        if cancelled_first:  # what the gateway does: cancel its call, then send Abort
            call.cancel()
        assert await prefill.abort("reused")
        assert not holds(decode, "reused") and not prefill.engine.kv.has_request("reused")
        assert call.done() and call.cancelled()
        tokens, _ = await generate(prefill, decode, address, "reused")
        assert tokens == expected
        await idle(decode)


async def test_a_request_id_still_running_here_is_refused(model):
    async with pair(model, LEASE_S) as (prefill, decode, address):
        call = await started(prefill, address, "twice")
        with pytest.raises(DuplicateRequestError, match="'twice' is already running"):
            await anext(prefill.prefill("twice", PROMPT, GREEDY, [address], timeout_s=30))
        assert holds(decode, "twice")  # the first one is untouched
        await prefill.abort("twice")
        assert call.cancelled()
        await idle(decode)


async def test_a_decode_node_answers_an_abort_once_its_running_step_let_the_request_go(model):
    """An abort of a request in the decode step takes effect when the step ends; the Abort answers then,
    so a Reserve reusing the id right after it is granted."""
    async with pair(model, LEASE_S) as (prefill, decode, address):
        slow_steps(decode, 0.3)
        generation = asyncio.ensure_future(generate(prefill, decode, address, "decoding"))
        # attached (else the abort could come first and the attach find nothing) and in the running step
        while not (decode.streams.get("decoding") and decode.streams["decoding"].attached
                   and "decoding" in decode.engine._in_flight):
            await asyncio.sleep(0.01)
        assert await decode.abort("decoding")
        assert not decode.engine.holds("decoding")
        grant = await decode.reserve("decoding", PROMPT, GREEDY, lease_s=None)
        assert grant.block_ids
        await decode.abort("decoding")
        await generation
        await idle(decode)

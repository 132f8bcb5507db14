"""A gateway whose ``Attach`` call ended before the request did (it stood still, its connection broke)
attaches again with ``resume_after`` and gets the rest exactly once; nobody coming back within the grace
frees everything; an ``Abort`` during the grace frees at once; a newer ``Attach`` takes over the older.
The real model, in-process (``DecodeNode.attach`` as the servicer calls it; closing the reader is what the
servicer does when the call ends)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.common.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.decode_node.node import DecodeNode, TokenStream
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine
from tests.gateway.fakes import eventually

pytestmark = pytest.mark.slow

NEW_TOKENS = 24
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompt(bundled_tokenizer):
    return bundled_tokenizer.encode("The lighthouse keeper counted the ships that passed")


@pytest.fixture(scope="module")
def expected(fp32_model, bundled_tokenizer, prompt):
    """The request's tokens, undisturbed (added to the engine directly, its first one is decoded here too)."""
    return list(make_engine(fp32_model, bundled_tokenizer).generate([prompt], GREEDY)[0].token_ids)


@contextlib.asynccontextmanager
async def running_node(fp32_model, bundled_tokenizer, grace_s: float):
    node = DecodeNode(make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=32), num_threads=2,
                      reattach_grace_s=grace_s)
    node.start()
    try:
        yield node
    finally:
        await node.stop()


async def _start(node: DecodeNode, prompt: list[int], rid: str = "r") -> None:
    """As if committed after a prefill (its stream made at the reservation)."""
    node.streams[rid] = TokenStream()
    await node.worker.call(lambda e: e.add_request(sampling=GREEDY, token_ids=prompt, request_id=rid))


async def _read(reader, at_least: int) -> list[int]:
    tokens: list[int] = []
    while len(tokens) < at_least:
        tokens += (await anext(reader)).token_ids
    return tokens


async def _idle(node: DecodeNode) -> None:
    """Nothing of any request is left: no stream, nothing running, every block free."""
    await eventually(lambda: not node.streams, timeout_s=30, what="streams gone")
    for _ in range(300):  # a request in the running step is let go when that step ends
        if not await node.worker.call(lambda e: e.has_unfinished()):
            break
        await asyncio.sleep(0.01)
    assert not await node.worker.call(lambda e: e.has_unfinished())
    assert node.engine.kv.num_free_blocks == node.engine.kv.num_blocks


async def test_reattach_after_a_lost_call_resumes_exactly_where_the_caller_stopped(fp32_model, bundled_tokenizer,
                                                                                  prompt, expected):
    async with running_node(fp32_model, bundled_tokenizer, grace_s=30.0) as node:
        await _start(node, prompt)
        first = node.attach("r")
        got = await _read(first, 3)
        await first.aclose()  # the call broke: the request runs on, its tokens kept
        assert "r" in node.streams and not node.streams["r"].attached
        await asyncio.sleep(0.3)  # more tokens are decoded with nobody attached
        events = [event async for event in node.attach("r", resume_after=len(got))]
        got += [token for event in events for token in event.token_ids]
        assert got == expected  # no gap, no duplicate
        assert events[-1].finish_reason == "length" and events[-1].completion_tokens == NEW_TOKENS
        # the ended stream is kept for the grace: its last event lost with the call is read again
        tail = [event async for event in node.attach("r", resume_after=NEW_TOKENS - 3)]
        assert [t for event in tail for t in event.token_ids] == expected[-3:]
        assert tail[-1].finish_reason == "length"
        await _idle(node)


async def test_nobody_back_within_the_grace_aborts_and_frees_everything(fp32_model, bundled_tokenizer, prompt):
    slow = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)  # still running at the grace's end
    async with running_node(fp32_model, bundled_tokenizer, grace_s=0.5) as node:
        node.streams["r"] = TokenStream()
        await node.worker.call(lambda e: e.add_request(sampling=slow, token_ids=prompt, request_id="r"))
        reader = node.attach("r")
        await _read(reader, 2)
        await reader.aclose()
        await _idle(node)  # aborted at the grace's end
        with pytest.raises(NotFoundError):
            await anext(node.attach("r", resume_after=2))


async def test_an_abort_during_the_grace_frees_at_once(fp32_model, bundled_tokenizer, prompt):
    async with running_node(fp32_model, bundled_tokenizer, grace_s=600.0) as node:
        await _start(node, prompt)
        reader = node.attach("r")
        await _read(reader, 2)
        await reader.aclose()
        assert await node.abort("r", "aborted by the gateway")
        await _idle(node)


async def test_a_newer_attach_takes_over_and_resume_after_past_the_stream_is_refused(fp32_model, bundled_tokenizer,
                                                                                    prompt, expected):
    async with running_node(fp32_model, bundled_tokenizer, grace_s=30.0) as node:
        await _start(node, prompt)
        older = node.attach("r")
        got = await _read(older, 2)
        with pytest.raises(InvalidArgumentError, match="resume_after"):
            await anext(node.attach("r", resume_after=NEW_TOKENS + 1))
        newer = node.attach("r", resume_after=len(got))
        got += (await anext(newer)).token_ids  # the newer one reads: the older one ends
        with pytest.raises(FailedPreconditionError, match="newer Attach"):
            await _read(older, NEW_TOKENS)
        assert node.streams["r"].attached
        got += [token async for event in newer for token in event.token_ids]
        assert got == expected
        await _idle(node)

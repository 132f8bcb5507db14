"""The HTTP front with long prompts, which are tokenized on the gateway's worker threads: a client that
leaves while its prompt waits for a thread takes its work out of the queue and opens nothing; a batch is
sized as a whole; a drain or a stopped pool never turns a request into a 500."""

from __future__ import annotations

import asyncio
import threading

from services.gateway.tokenizing import INLINE_TOKENS, WORKERS, all_tokenize_inline
from tests.gateway.fakes import eventually

LONG = " hello" * 410  # 2460 characters, 410 tokens: past INLINE_CHARS, within the test's context of 512


def test_a_batch_is_sized_as_a_whole():
    assert all_tokenize_inline([("x" * 1500, None)])
    assert not all_tokenize_inline([("x" * 1500, None)] * 2)


async def test_a_client_that_leaves_while_its_prompt_waits_for_a_thread_opens_nothing(front):
    core = front.cluster.gateway.core
    threads = core._tokenizer_threads
    gate = threading.Event()
    busy = [asyncio.ensure_future(threads.run(lambda: gate.wait(10), inline=False)) for _ in range(WORKERS)]
    try:
        await eventually(lambda: threads.pending == WORKERS, what="both threads busy")
        leaving = asyncio.ensure_future(front.http.post("/v1/completions", json={"prompt": LONG, "max_tokens": 1}))
        await eventually(lambda: threads.pending == WORKERS + 1, what="the prompt queued")
        registry = front.cluster.gateway.servicer.metrics.registry
        assert registry.get_sample_value("pdserve_gateway_tokenizing") == WORKERS + 1
        leaving.cancel()  # closes the connection
        await eventually(lambda: threads.pending == WORKERS, what="the queued prompt dropped")
    finally:
        gate.set()
        await asyncio.gather(*busy)
    await asyncio.sleep(0.2)  # what the dropped prompt would have done, had it stayed
    assert front.cluster.p.requests == [] and core.in_flight == 0 and not core._taken
    reply = await front.http.post("/v1/completions", json={"prompt": LONG, "max_tokens": 1})
    assert reply.status_code == 200, reply.text


async def test_a_drain_refuses_long_prompts_with_a_503_and_tokenize_still_answers(front, tokenizer):
    core = front.cluster.gateway.core
    await core.drain(0.0)
    batch = await front.http.post("/v1/completions", json={"prompt": [LONG, LONG], "max_tokens": 1})
    assert batch.status_code == 503, batch.text
    assert (await front.http.post("/tokenize", json={"prompt": LONG})).json()["tokens"] == tokenizer.encode(LONG)
    core.close()  # as the gateway does once its fronts stopped: later work runs on the loop
    assert (await front.http.post("/tokenize", json={"prompt": LONG})).json()["tokens"] == tokenizer.encode(LONG)


async def test_detokenize_of_many_ids_gives_their_text(front, tokenizer):
    ids = tokenizer.encode(LONG) * (INLINE_TOKENS // 400 + 1)
    assert len(ids) > INLINE_TOKENS
    reply = await front.http.post("/detokenize", json={"tokens": ids})
    assert reply.status_code == 200 and reply.json()["prompt"] == tokenizer.decode(ids)


async def test_a_long_prompt_with_n_choices_runs_each_from_one_tokenizing(front, tokenizer):
    reply = await front.http.post("/v1/completions", json={"prompt": LONG, "max_tokens": 1, "n": 2})
    assert reply.status_code == 200, reply.text
    assert [list(r.prompt_token_ids) for r in front.cluster.p.requests] == [tokenizer.encode(LONG)] * 2

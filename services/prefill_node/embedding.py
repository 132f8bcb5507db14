"""One ``Embed`` call on this prefill node: the prompt is prefilled here as an embedding request
(``LLMEngine.admit_embedding``: prefix cache, chunks and batching as any prompt's, no decode node, nothing of its
KV read out) and answered with the final hidden state of its last token.

It lives as a ``Prefill`` call does: registered by id from start to the end of its cleanup (``live_requests.py``:
an ``Abort`` answers once it is gone, a drain ends it while it is still queued, an engine failure ends it with
``UNAVAILABLE``), and whatever ends it frees what it held here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from services.common import tracing
from services.common.cancellation import uncancellable
from services.common.errors import UnavailableError
from services.engine.engine import LLMEngine
from services.engine.prefill_role import FirstToken
from services.engine.sampling_params import EMBEDDING_SAMPLING
from services.engine_node.step_spans import RequestTrace
from services.prefill_node.node import Handoffs, PrefillNode


@dataclass(frozen=True)
class Embedded:
    embedding: list[float]  # float32 values, not normalised
    cached_tokens: int  # prompt tokens served from the prefix cache


async def embed(node: PrefillNode, request_id: str, prompt_ids: list[int]) -> Embedded:
    node.refuse_if_closed()
    live = await node.live.enter(request_id)
    try:
        return await _embed(node, request_id, prompt_ids)
    except asyncio.CancelledError:
        if live.ended_by is None:
            raise
        raise UnavailableError(f"request {request_id!r} ended: {live.ended_by}") from None
    finally:
        live.ending = True  # an Abort from now on waits for this cleanup
        try:
            await uncancellable(node.free_here(request_id))
        finally:
            node.live.leave(request_id, live)


async def _embed(node: PrefillNode, request_id: str, prompt_ids: list[int]) -> Embedded:
    await node.worker.call(LLMEngine.check_prefill, prompt_ids, EMBEDDING_SAMPLING)
    trace = tracing.current_context()
    queue = node.handoffs[request_id] = Handoffs()
    hook = RequestTrace(trace, time.time_ns()) if trace is not None else None  # queue, prefill_chunk spans
    await node.worker.call(LLMEngine.admit_embedding, request_id, prompt_ids, hook)
    while not isinstance(item := await queue.get(), FirstToken):
        pass  # an embedding request's KV is never read out: nothing else comes
    assert item.embedding is not None, "an embedding request's first token carries its embedding"
    return Embedded(item.embedding, item.cached_tokens)

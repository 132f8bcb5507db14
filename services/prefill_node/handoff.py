"""What the prefill node's engine thread hands to the event loop after each step, per request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from kvcache.kv_bytes import read_blocks
from services.engine.engine import LLMEngine
from services.engine.logprobs import TokenLogprobs
from services.engine.outputs import RequestOutput
from services.engine.request import Request, RequestStatus


@dataclass
class ReadyBlocks:
    """KV of blocks ``first_index ..`` of the request's table (prompt order), ``count`` blocks: their
    bytes, or (a request sent by CUDA IPC) their ids in this node's pool, computed and synchronised."""

    first_index: int
    count: int
    payload: bytes
    source_ids: list[int] | None = None


@dataclass
class FirstToken:
    token_id: int
    finish_reason: str | None  # set when the first token already ends the request
    cached_tokens: int
    logprob: TokenLogprobs | None = None  # when the request asks for logprobs


@dataclass
class Tracked:
    """A request being prefilled here: its engine request and what was already read out."""

    request: Request
    queue: asyncio.Queue[ReadyBlocks | FirstToken] = field(default_factory=asyncio.Queue)
    blocks_read: int = 0
    skip_blocks: int = 0  # leading blocks the decode node already holds
    by_reference: bool = False  # its decode node copies blocks out of this pool (CUDA IPC): send ids


def collect(engine: LLMEngine, tracked: dict[str, Tracked], outputs: list[RequestOutput]
            ) -> list[tuple[Tracked, ReadyBlocks | FirstToken]]:
    """On the engine thread: note first tokens and read the KV of blocks that became complete. Everything
    one step produced is delivered together, first tokens ahead of that step's blocks. Blocks sent by
    reference are handed over only once the device has finished writing them."""
    items: list[tuple[Tracked, ReadyBlocks | FirstToken]] = []
    synchronized = False
    for out in outputs:  # first tokens go first: the client sees them before the last blocks are sent
        state = tracked.get(out.request_id)
        if state is not None and out.new_token_ids:
            reason = None if state.request.status is RequestStatus.FINISHED_HANDED_OFF else out.finish_reason
            items.append((state, FirstToken(out.new_token_ids[0], reason, state.request.num_cached_tokens,
                                                     out.new_logprobs[0] if out.new_logprobs else None)))
    for state in list(tracked.values()):
        request = state.request
        if request.status is RequestStatus.FINISHED_ABORTED:
            continue
        if request.status.finished and request.status is not RequestStatus.FINISHED_HANDED_OFF:
            continue  # ended at its first token: its blocks are already freed, nothing to send
        if not engine.kv.has_request(request.request_id):
            continue  # still queued: no blocks yet
        ready = engine.transferable_block_ids(request)
        start = max(state.blocks_read, state.skip_blocks)
        if len(ready) > start:
            if state.by_reference:
                pool = engine.runner.kv_cache
                if not synchronized and pool.device.type == "cuda":
                    torch.cuda.synchronize(pool.device)  # the step's kernels wrote these blocks
                    synchronized = True
                items.append((state, ReadyBlocks(start, len(ready) - start, b"", list(ready[start:]))))
            else:
                payload = read_blocks(engine.runner.kv_cache, ready[start:])
                items.append((state, ReadyBlocks(start, len(ready) - start, payload)))
            state.blocks_read = len(ready)
    return items

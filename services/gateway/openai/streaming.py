"""A request's response: one JSON body, or server-sent events.

Streaming waits for the first chunk before answering, so that what fails before any token (bad sampling
the nodes refuse, no healthy node, a deadline) still gets its own HTTP status. After that the status is
200 and a failure is an error event in OpenAI's shape, then ``data: [DONE]``::

    data: {"id": "cmpl-…", "object": "text_completion", "choices": [{"text": "Hello", …}], …}\\n\\n
    data: {… "choices": [], "usage": {…}}\\n\\n        (stream_options.include_usage only)
    data: [DONE]\\n\\n

With vLLM's ``stream_options.continuous_usage_stats`` (and ``include_usage``) every chunk carries the usage of
its choice so far as well.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from services.common.errors import ServiceError
from services.engine.errors import InvalidRequestError
from services.engine.logprobs import TokenLogprobs
from services.gateway.generation import GenerateChunk, Usage
from services.gateway.openai.errors import OpenAIError, from_gateway
from services.gateway.openai.responses import UsageBody
from services.gateway.openai.running import RunningRequest
from services.gateway.openai.translate import Renderer, usage_body

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(body: BaseModel) -> bytes:
    return b"data: " + body.model_dump_json().encode() + b"\n\n"


Choice = tuple[RunningRequest, Renderer]
"""One of a request's ``n`` choices: its running request, and the renderer that gives it its index."""


async def respond(choices: Sequence[Choice], stream: bool, include_usage: bool, per_prompt: int = 1,
                  continuous_usage: bool = False) -> Response:
    """Run the opened requests (the choices of one HTTP request: ``per_prompt`` = ``n`` of each prompt, prompt
    by prompt) to their response; each is closed however this ends. ``continuous_usage``: every streamed chunk
    carries its choice's usage so far (vLLM's ``continuous_usage_stats``)."""
    streams = [running.chunks() for running, _ in choices]  # each closes its request when it ends
    renderers = [renderer for _, renderer in choices]
    if not stream:
        return await _whole(streams, renderers, per_prompt)
    firsts = await asyncio.gather(*(first_chunk(chunks) for chunks in streams))
    counts = [_RunningUsage(_prompt_tokens(running)) for running, _ in choices] if continuous_usage else None
    return StreamingResponse(_events(firsts, streams, renderers, include_usage, per_prompt, counts),
                             media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(_close_all, choices))


def _close_all(choices: Sequence[Choice]) -> None:
    for running, _ in choices:
        running.close()


async def first_chunk(chunks: AsyncIterator[GenerateChunk]) -> GenerateChunk:
    """The request's first chunk (a 502 when it ended without one)."""
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        raise OpenAIError(502, "the request ended without a token", "server_error") from None


@dataclass
class _Collected:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    last: GenerateChunk | None = None


async def _collect(chunks: AsyncIterator[GenerateChunk]) -> _Collected:
    collected = _Collected()
    async for chunk in chunks:  # to the end: the flow and the request close there
        collected.text.append(chunk.text)
        collected.logprobs += chunk.logprobs
        collected.prompt_logprobs = collected.prompt_logprobs or chunk.prompt_logprobs
        collected.last = chunk
    if collected.last is None or collected.last.usage is None:
        raise OpenAIError(502, "the request ended without a finish reason", "server_error")
    return collected


async def _whole(streams: Sequence[AsyncIterator[GenerateChunk]], renderers: Sequence[Renderer],
                 per_prompt: int) -> Response:
    every = await asyncio.gather(*(_collect(chunks) for chunks in streams))
    bodies = []
    for collected, renderer in zip(every, renderers, strict=True):
        last = collected.last
        assert last is not None and last.usage is not None
        bodies.append(renderer.whole("".join(collected.text), last.finish_reason, last.usage, collected.logprobs,
                                     collected.prompt_logprobs))
    usage = combined_usage([c.last.usage for c in every if c.last is not None and c.last.usage is not None],
                           per_prompt)
    body = bodies[0].model_copy(update={"choices": [b.choices[0] for b in bodies], "usage": usage_body(usage)})
    return Response(body.model_dump_json(), media_type="application/json")


def combined_usage(usages: Sequence[Usage], per_prompt: int = 1) -> Usage:
    """The usage of the choices of one HTTP request, ``per_prompt`` of each prompt, prompt by prompt: each
    prompt once, every choice's tokens (as OpenAI and vLLM count)."""
    firsts = usages[::per_prompt]  # one choice of each prompt
    return Usage(sum(u.prompt_tokens for u in firsts), sum(u.completion_tokens for u in usages),
                 sum(u.cached_tokens for u in firsts))


async def _merged(streams: Sequence[AsyncIterator[GenerateChunk]]) -> AsyncIterator[tuple[int, GenerateChunk]]:
    """The chunks of every stream as they come, with the stream's index; the first failure is raised (the
    other streams are then closed, their requests cancelled)."""
    if len(streams) == 1:  # no task hop for the common case
        async for chunk in streams[0]:
            yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, GenerateChunk | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, chunks: AsyncIterator[GenerateChunk]) -> None:
        try:
            async for chunk in chunks:
                queue.put_nowait((index, chunk, None))
        except Exception as error:  # not swallowed: raised below, in the response's task
            queue.put_nowait((index, None, error))
            return
        queue.put_nowait((index, None, None))

    pumps = [asyncio.ensure_future(pump(i, chunks)) for i, chunks in enumerate(streams)]
    try:
        left = len(pumps)
        while left:
            index, chunk, error = await queue.get()
            if error is not None:
                raise error
            if chunk is None:
                left -= 1
                continue
            yield index, chunk
    finally:
        for task in pumps:
            task.cancel()


def _prompt_tokens(running: RunningRequest) -> int:
    assert running.flow is not None, "an opened request"
    return len(running.flow.request.prompt_ids)


class _RunningUsage:
    """One choice's usage as its chunks stream (``continuous_usage_stats``): its prompt's tokens and the tokens
    generated so far; the prefix-cache hits are known only at the end (``prompt_tokens_details`` null before)."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens, self.completion_tokens = prompt_tokens, 0

    def stamped(self, body: BaseModel | None, chunk: GenerateChunk) -> BaseModel | None:
        """``body`` (the chunk's, None: nothing shown) with the usage up to ``chunk``, which counts either way."""
        self.completion_tokens += len(chunk.token_ids)
        if body is None:
            return None
        usage = usage_body(chunk.usage) if chunk.usage is not None else UsageBody(
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens, prompt_tokens_details=None)
        return body.model_copy(update={"usage": usage})


async def _events(firsts: Sequence[GenerateChunk], rest: Sequence[AsyncIterator[GenerateChunk]],
                  renderers: Sequence[Renderer], include_usage: bool, per_prompt: int,
                  counts: Sequence[_RunningUsage] | None = None) -> AsyncIterator[bytes]:
    usages: list[Usage | None] = [first.usage for first in firsts]

    def shown(index: int, chunk: GenerateChunk, first: bool) -> bytes | None:
        body = renderers[index].chunk(chunk, first)
        if counts is not None:
            body = counts[index].stamped(body, chunk)
        return event(body) if body is not None else None

    for index, first in enumerate(firsts):
        if (data := shown(index, first, True)) is not None:
            yield data
    try:
        async for index, chunk in _merged(rest):
            if (data := shown(index, chunk, False)) is not None:
                yield data
            usages[index] = chunk.usage or usages[index]
    except (ServiceError, InvalidRequestError) as error:
        yield event(from_gateway(error).body())
        yield DONE
        return
    if include_usage and all(u is not None for u in usages):
        yield event(renderers[0].usage_chunk(combined_usage([u for u in usages if u is not None], per_prompt)))
    yield DONE

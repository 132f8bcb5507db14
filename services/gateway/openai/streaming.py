"""A request's response: one JSON body, or server-sent events.

Streaming waits for the first chunk before answering, so that what fails before any token (bad sampling
the nodes refuse, no healthy node, a deadline) still gets its own HTTP status. After that the status is
200 and a failure is an error event in OpenAI's shape, then ``data: [DONE]``::

    data: {"id": "cmpl-…", "object": "text_completion", "choices": [{"text": "Hello", …}], …}\\n\\n
    data: {… "choices": [], "usage": {…}}\\n\\n        (stream_options.include_usage only)
    data: [DONE]\\n\\n
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from services.common.errors import ServiceError
from services.engine.errors import InvalidRequestError
from services.engine.logprobs import TokenLogprobs
from services.gateway.generation import GenerateChunk, Usage
from services.gateway.openai.errors import OpenAIError, from_gateway
from services.gateway.openai.running import RunningRequest
from services.gateway.openai.translate import Renderer

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(body: BaseModel) -> bytes:
    return b"data: " + body.model_dump_json().encode() + b"\n\n"


async def respond(running: RunningRequest, renderer: Renderer, stream: bool, include_usage: bool) -> Response:
    """Run the opened request to its response; ``running`` is closed however this ends."""
    chunks = running.chunks()  # closes the request when it ends
    if not stream:
        return await _whole(chunks, renderer)
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        raise OpenAIError(502, "the request ended without a token", "server_error") from None
    return StreamingResponse(_events(first, chunks, renderer, include_usage), media_type="text/event-stream",
                             headers=SSE_HEADERS, background=BackgroundTask(running.close))


async def _whole(chunks: AsyncIterator[GenerateChunk], renderer: Renderer) -> Response:
    text: list[str] = []
    logprobs: list[TokenLogprobs] = []
    last: GenerateChunk | None = None
    async for chunk in chunks:  # to the end: the flow and the request close there
        text.append(chunk.text)
        logprobs += chunk.logprobs
        last = chunk
    if last is None or last.usage is None:
        raise OpenAIError(502, "the request ended without a finish reason", "server_error")
    body = renderer.whole("".join(text), last.finish_reason, last.usage, logprobs)
    return Response(body.model_dump_json(), media_type="application/json")


async def _events(first: GenerateChunk, rest: AsyncIterator[GenerateChunk], renderer: Renderer,
                  include_usage: bool) -> AsyncIterator[bytes]:
    usage: Usage | None = first.usage
    body = renderer.chunk(first, True)
    if body is not None:
        yield event(body)
    try:
        async for chunk in rest:
            body = renderer.chunk(chunk, False)
            if body is not None:
                yield event(body)
            usage = chunk.usage or usage
    except (ServiceError, InvalidRequestError) as error:
        yield event(from_gateway(error).body())
        yield DONE
        return
    if include_usage and usage is not None:
        yield event(renderer.usage_chunk(usage))
    yield DONE

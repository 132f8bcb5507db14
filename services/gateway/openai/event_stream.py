"""One opened request answered by an event state machine (the Responses and Messages APIs'): its chunks read
into the whole response, or streamed as the machine's server-sent events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from services.common.errors import ServiceError
from services.engine.errors import InvalidRequestError
from services.gateway.generation import GenerateChunk
from services.gateway.openai.errors import OpenAIError, from_gateway
from services.gateway.openai.running import RunningRequest
from services.gateway.openai.streaming import SSE_HEADERS, first_chunk


def sse(body: dict[str, Any]) -> bytes:
    """One server-sent event named by its body's ``type`` (the Responses and Messages APIs' framing)."""
    return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n".encode()


class EventMachine(Protocol):
    def opening(self) -> list[bytes]:
        """The events before the first chunk's."""

    def chunk(self, chunk: GenerateChunk) -> list[bytes]:
        """The events of one chunk (the last, with its finish reason, ends the response)."""

    def failed(self, status: int, message: str) -> list[bytes]:
        """The events of a failure after the first token (``status``: the HTTP status it would have had)."""

    def whole(self) -> bytes | None:
        """The whole response's JSON, once the last chunk was read (None before)."""


async def respond(running: RunningRequest, events: EventMachine, stream: bool) -> Response:
    """The response of one opened request, whole or streamed; the request is closed however this ends.
    Streamed, it starts with the first chunk, so what fails before any token still gets its own HTTP status."""
    chunks = running.chunks()  # closes the request when it ends
    if not stream:  # the stream's own reading of the chunks: the same response either way
        async for chunk in chunks:
            events.chunk(chunk)
        whole = events.whole()
        if whole is None:
            raise OpenAIError(502, "the request ended without a finish reason", "server_error")
        return Response(whole, media_type="application/json")
    first = await first_chunk(chunks)
    return StreamingResponse(_events(events, first, chunks), media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(running.close))


async def _events(events: EventMachine, first: GenerateChunk, rest: AsyncIterator[GenerateChunk]
                  ) -> AsyncIterator[bytes]:
    for data in [*events.opening(), *events.chunk(first)]:
        yield data
    if first.finish_reason:
        return
    try:
        async for chunk in rest:
            for data in events.chunk(chunk):
                yield data
            if chunk.finish_reason:
                return
    except (ServiceError, InvalidRequestError) as error:
        failure = from_gateway(error)
        for data in events.failed(failure.status, failure.detail.message):
            yield data
        return
    for data in events.failed(502, "the request ended without a finish reason"):
        yield data

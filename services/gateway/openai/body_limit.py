"""ASGI middleware: a request body over ``max_bytes`` gets 413 in OpenAI's shape, never held in memory;
one that has not all arrived ``body_timeout_s`` after the request began gets 408 (a client that declares
a length and sends less would otherwise hold its request, and the memory it took, for ever).

A declared ``Content-Length`` over the limit is refused before the app runs: the body is read and thrown
away chunk by chunk (up to ``discard_bytes``; a client that sends its whole body before reading the answer
would otherwise see the connection reset instead of the 413), then the 413 is sent. A body without a
length (chunked) is counted as the app reads it and refused the moment it passes the limit.
"""

from __future__ import annotations

import asyncio
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.openai.errors import OpenAIError


def too_large(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes ({limit / (1 << 20):g} MiB)"


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, discard_bytes: int = 256 << 20,
                 body_timeout_s: float = 0.0) -> None:
        """``body_timeout_s``: 0 = no limit."""
        self.app = app
        self.max_bytes = max_bytes
        self.discard_bytes = discard_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        deadline = time.monotonic() + self.body_timeout_s
        if declared is not None and declared > self.max_bytes:
            await self._discard(receive, deadline)
            await self._refuse(scope, receive, send)
            return
        received = 0
        body_done = False

        async def counted() -> Message:
            nonlocal received, body_done
            try:  # once the body is in, waiting for the client to leave is fine
                message = await (receive() if body_done else self._receive_by(receive, deadline))
            except asyncio.TimeoutError:  # TimeoutError itself only from Python 3.11
                raise HTTPException(408, f"the request body did not arrive within {self.body_timeout_s:g} s "
                                         f"({received} bytes came)") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_bytes:
                    raise HTTPException(413, too_large(self.max_bytes))  # the app's handler shapes it
            return message

        await self.app(scope, counted, send)

    async def _discard(self, receive: Receive, deadline: float) -> None:
        """Read and drop the body, up to ``discard_bytes`` and until the body timeout (a client that never
        sends what it declared gets its 413 then)."""
        thrown = 0
        while thrown <= self.discard_bytes:
            try:
                message = await self._receive_by(receive, deadline)
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request":
                return
            thrown += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def _receive_by(self, receive: Receive, deadline: float) -> Message:
        """The next message of the body; ``asyncio.TimeoutError`` past ``deadline`` (when there is a body
        timeout)."""
        if not self.body_timeout_s:
            return await receive()
        return await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = OpenAIError(413, too_large(self.max_bytes), param="body", code="request_too_large")
        await error.response()(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None

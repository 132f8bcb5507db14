"""ASGI middleware: a request body over ``max_bytes`` gets 413 in OpenAI's shape (Anthropic's on
``/v1/messages``), never held in memory;
one that has not all arrived ``body_timeout_s`` after the request began gets 408 (a client that declares
a length and sends less would otherwise hold its request, and the memory it took, for ever).

A declared ``Content-Length`` over the limit is refused at once, before any of the body is read: the 413
(with ``Connection: close``) goes out first, then what the client still sends is read and thrown away, up
to ``discard_bytes`` and for ``linger_s`` at most (within the body timeout), so a client that writes its
whole body before reading the answer sees the 413 rather than a connection reset; then the connection
closes. A body without a length (chunked) is counted as the app reads it and refused the moment it passes
the limit.

A request carrying both ``Content-Length`` and ``Transfer-Encoding`` is refused with 400 and the connection
closed: behind a proxy that frames it by the other header, it is how requests are smuggled.
"""

from __future__ import annotations

import asyncio
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.openai.errors import OpenAIError

BOTH_FRAMINGS = ("the request has both Content-Length and Transfer-Encoding headers: refused (ambiguous "
                 "framing, as in request smuggling)")


def too_large(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes ({limit / (1 << 20):g} MiB)"


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, discard_bytes: int = 256 << 20,
                 body_timeout_s: float = 0.0, linger_s: float = 5.0) -> None:
        """``body_timeout_s``: 0 = no limit; ``linger_s``: how long a refused body is still read."""
        self.app = app
        self.max_bytes = max_bytes
        self.discard_bytes = discard_bytes
        self.body_timeout_s = body_timeout_s
        self.linger_s = linger_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name for name, _ in scope.get("headers", ())}
        if b"content-length" in headers and b"transfer-encoding" in headers:
            await self._refuse(OpenAIError(400, BOTH_FRAMINGS, param="headers", code="ambiguous_framing"), scope,
                               receive, send, linger=False)
            return
        declared = _content_length(scope)
        deadline = time.monotonic() + self.body_timeout_s
        if declared is not None and declared > self.max_bytes:
            error = OpenAIError(413, too_large(self.max_bytes), param="body", code="request_too_large")
            await self._refuse(error, scope, receive, send, linger=True)
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

    async def _refuse(self, error: OpenAIError, scope: Scope, receive: Receive, send: Send, *, linger: bool
                      ) -> None:
        """Send ``error`` whole at once (the client has its answer), then, with ``linger``, read and drop the
        body before the response ends and the server closes the connection."""
        response = error.response(scope.get("path", ""))
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": [*response.raw_headers, (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": response.body, "more_body": linger})
        if linger:
            await self._discard(receive, time.monotonic() + self.linger_s)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _discard(self, receive: Receive, until: float) -> None:
        """Read and drop the body, up to ``discard_bytes``, until ``until`` or the body timeout."""
        if self.body_timeout_s:
            until = min(until, time.monotonic() + self.body_timeout_s)
        thrown = 0
        while thrown <= self.discard_bytes:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, until - time.monotonic()))
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


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None

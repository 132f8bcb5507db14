"""uvicorn serving the HTTP front as a task of the gateway's running event loop (no thread, no second loop).

The socket is bound here (port 0 = ephemeral), so a taken port fails ``start()`` and ``url`` is known at
once. uvicorn's own signal handling is off: the gateway's ``NodeServer`` owns SIGTERM/SIGINT and calls
the drain, which flips ``FrontState.draining`` (new generation requests get 503, ``/health`` too) before
the core drains; ``stop()`` then closes the listener and waits up to ``grace_s`` for open responses.

A connection has ``header_timeout_s`` to send a request's headers: from the moment it is made (TLS done)
for its first request, from its first byte for each later keep-alive request. Past that it is closed
unanswered. Without it a client that sends nothing, or headers that never end, holds its connection (and
its place among ``max_connections``) for ever: uvicorn's keep-alive timeout starts only after a response,
and the body timeout (``BodyLimit``) only once the headers are complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import h11
import structlog
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from services.gateway.openai.app import FrontState

log = structlog.get_logger(__name__)


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the gateway's NodeServer handles signals


class _HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers (``header_timeout_s`` > 0; a
    subclass per front sets it). The deadline runs while h11 waits for a request (``their_state`` IDLE):
    armed when the connection is made and when a later request's first bytes arrive, cancelled once h11
    has parsed the request's headers; at expiry the transport is closed."""

    header_timeout_s: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers():
            self._arm_header_deadline()  # a later keep-alive request begins (a no-op while one is armed)
        super().data_received(data)
        if not self._awaiting_headers():
            self._cancel_header_deadline()
        else:  # these bytes ended a request answered early and began the next (uvicorn dropped its
            self._arm_header_deadline()  # keep-alive timer on them): the next one's headers are due too

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # the next request's first bytes may already be buffered (pipelined) without more to come
        if self._awaiting_headers() and self.conn.trailing_data[0]:
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _arm_header_deadline(self) -> None:
        if self.header_timeout_s > 0 and self._header_deadline is None and not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_deadline_passed)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        if not self._awaiting_headers() or self.transport.is_closing():
            return
        log.debug("HTTP connection closed: no complete request headers in time", client=self.client,
                  header_timeout_s=self.header_timeout_s)
        self._unset_keepalive_if_required()
        self.transport.close()


def split_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:8000"`` / ``"[::1]:0"`` → (host, port); ``ValueError`` naming the problem."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {listen!r}")
    return host.strip("[]"), int(port)


class HttpFront:
    def __init__(self, app: FastAPI, listen: str, state: FrontState, grace_s: float = 5.0,
                 max_connections: int | None = None, ssl_context: ssl.SSLContext | None = None,
                 header_timeout_s: float = 10.0) -> None:
        """``max_connections``: connections and requests at once (uvicorn's ``limit_concurrency``: a request
        beyond it gets 503); None = no limit. ``ssl_context``: serve HTTPS with it (``PublicTls``'s, which
        takes a rotated certificate at the next handshake); None = plain HTTP. ``header_timeout_s``: seconds
        a connection has to send a request's complete headers, then it is closed; 0 = no limit."""
        self.app = app
        self.header_timeout_s = header_timeout_s
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.listen = listen
        self.state = state
        self.grace_s = grace_s
        self.port: int | None = None
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (``https://`` with TLS; a bracketed IPv6 host); empty before ``start()``."""
        if self.port is None:
            return ""
        host = self.listen.rpartition(":")[0]
        return f"{'https' if self.ssl_context is not None else 'http'}://{host}:{self.port}"

    async def start(self) -> None:
        host, port = split_listen(self.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as error:
            sock.close()
            raise OSError(f"cannot bind the HTTP front {self.listen}: {error}") from error
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, lifespan="off", log_config=None, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=max(self.grace_s, 0.1), timeout_keep_alive=30,
                                limit_concurrency=self.max_connections,
                                http=type("HeaderDeadlineProtocol", (_HeaderDeadlineProtocol,),
                                          {"header_timeout_s": self.header_timeout_s}))
        config.load()
        config.ssl = self.ssl_context  # ours, not one uvicorn builds from file names (it could not reload them)
        server = self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="http-front")
        while not server.started and not self._task.done():
            await asyncio.sleep(0.005)
        if self._task.done():
            sock.close()
            self._task.result()  # raises what stopped it
            raise OSError(f"the HTTP front on {self.listen} stopped while starting")
        log.info("HTTP front serving", url=self.url)

    async def stop(self) -> None:
        """Refuse new requests, close the listener, give open responses ``grace_s``. Idempotent."""
        self.state.draining = True
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        finally:
            self._server = None
            log.info("HTTP front stopped")

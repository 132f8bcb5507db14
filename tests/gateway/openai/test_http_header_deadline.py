"""The HTTP front's header deadline (``http_header_timeout_s``): a connection that sends nothing, or request
headers that never end (slowloris: a byte now and then), is closed unanswered once the deadline passes, so
such connections cannot fill ``http_max_connections`` and have everyone else answered 503. Requests whose
headers arrive in time are untouched, a slow body included (that is the body timeout's business), and so
is a keep-alive connection idle between requests; a later request on it gets the deadline again."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from services.gateway.config import GatewayConfig
from tests.gateway.openai.conftest import start_front, stop_front

DEADLINE_S = 0.5
MARGIN_S = 2.5  # a loaded test machine; the deadline itself is checked from below as well
LIMIT = 5  # http_max_connections: uvicorn answers 503 once the open connections (the asking one too) reach it


@pytest.fixture
async def deadlined(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, http_header_timeout_s=DEADLINE_S, http_max_connections=LIMIT)
    try:
        yield front
    finally:
        await stop_front(front)


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def closed_after(reader: asyncio.StreamReader, started: float) -> float:
    """Seconds from ``started`` until the server closed the connection (having sent nothing)."""
    data = await asyncio.wait_for(reader.read(), DEADLINE_S + MARGIN_S)
    assert data == b"", f"the server answered instead of closing: {data[:200]!r}"
    return asyncio.get_running_loop().time() - started


async def trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    """Write ``data`` a byte at a time (slowloris), until the server closes the connection."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(every_s)
        await asyncio.sleep(3600)


async def response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The status line and the body of one response with a Content-Length."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                 .split(b":")[1])
    return head.split(b"\r\n")[0], await asyncio.wait_for(reader.readexactly(length), 10)


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_connections_without_complete_headers_are_closed_at_the_deadline(deadlined):
    loop = asyncio.get_running_loop()
    started = loop.time()
    silent = await connect(deadlined.url)
    partial = await connect(deadlined.url)
    partial[1].write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    slowloris = await connect(deadlined.url)
    trickling = asyncio.create_task(trickle(slowloris[1], HEALTH[:-2] + b"X-A: " + b"a" * 100, every_s=0.05))
    try:
        # meanwhile the front answers others (3 slow connections + this one stay below the limit)
        assert (await deadlined.http.get("/health")).status_code == 200
        for reader, _ in (silent, partial, slowloris):
            assert DEADLINE_S - 0.1 <= await closed_after(reader, started) <= DEADLINE_S + MARGIN_S
        assert (await deadlined.http.get("/health")).status_code == 200
    finally:
        trickling.cancel()
        for _, writer in (silent, partial, slowloris):
            writer.close()


async def test_silent_connections_no_longer_hold_the_front_503(deadlined):
    """Past ``http_max_connections`` the front answers 503; the silent holders are closed at the deadline
    (the client never closes them), and the front answers 200 again."""
    idle = [await connect(deadlined.url) for _ in range(LIMIT)]
    try:
        async with httpx.AsyncClient(base_url=deadlined.url) as client:
            assert (await client.get("/health")).status_code == 503
        for reader, _ in idle:
            assert await asyncio.wait_for(reader.read(), DEADLINE_S + MARGIN_S) == b""
        async with httpx.AsyncClient(base_url=deadlined.url) as client:
            assert (await client.get("/health")).status_code == 200
    finally:
        for _, writer in idle:
            writer.close()


async def test_prompt_headers_are_untouched_and_keep_alive_requests_get_the_deadline_again(deadlined):
    reader, writer = await connect(deadlined.url)
    try:
        writer.write(HEALTH)
        assert (await response(reader))[0] == b"HTTP/1.1 200 OK"
        await asyncio.sleep(DEADLINE_S * 2)  # idle between requests: keep-alive's business, not the deadline's
        writer.write(HEALTH)
        assert (await response(reader))[0] == b"HTTP/1.1 200 OK"
        # headers in time, the body later than the header deadline (well within the body timeout): served
        body = b'{"prompt": "Hi", "max_tokens": 1}'
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        await asyncio.sleep(DEADLINE_S * 2)
        writer.write(body)
        assert (await response(reader))[0] == b"HTTP/1.1 200 OK"
        # a later request whose headers never end: the deadline runs from its first byte
        started = asyncio.get_running_loop().time()
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        assert DEADLINE_S - 0.1 <= await closed_after(reader, started) <= DEADLINE_S + MARGIN_S
    finally:
        writer.close()


async def test_no_deadline_when_zero(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, http_header_timeout_s=0)
    try:
        reader, writer = await connect(front.url)
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(), DEADLINE_S * 3)
            writer.write(HEALTH)
            assert (await response(reader))[0] == b"HTTP/1.1 200 OK"
        finally:
            writer.close()
    finally:
        await stop_front(front)


def test_header_timeout_must_not_be_negative():
    base = {"prefill": "127.0.0.1:1", "decode": "127.0.0.1:2"}
    with pytest.raises(ValueError, match="http_header_timeout_s"):
        GatewayConfig(**base, http_header_timeout_s=-1)
    assert GatewayConfig(**base).http_header_timeout_s == 10.0


async def test_the_next_requests_headers_are_due_after_a_request_answered_before_its_body(deadlined):
    """The front answers ``GET /health`` before reading its body; the body's end and the first bytes of the
    next request then come in one packet. uvicorn drops its keep-alive timer on those bytes, and the deadline
    was not armed for the next request: the connection stayed open for good (found by review)."""
    reader, writer = await connect(deadlined.url)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
        assert (await response(reader))[0] == b"HTTP/1.1 200 OK"
        await asyncio.sleep(0.1)
        writer.write(b"12345GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        assert await asyncio.wait_for(reader.read(), DEADLINE_S + MARGIN_S) == b""  # closed, unanswered
    finally:
        writer.close()

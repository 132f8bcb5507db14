"""Limits on what clients hold at the gateway's HTTP front: a body that never all arrives gets 408 and
frees its request; one declared past the body limit gets 413 at once; both Content-Length and
Transfer-Encoding get 400; past ``http_max_connections`` a request gets 503, and the next gets in once the
holders leave."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from services.gateway.config import GatewayConfig
from tests.gateway.openai.conftest import start_front, stop_front


@pytest.fixture
async def limited(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, http_body_timeout_s=0.5, http_max_connections=3)
    try:
        yield front
    finally:
        await stop_front(front)


async def raw_request(url: str, head: bytes, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + body)
    await writer.drain()
    return reader, writer


def completions_head(length: int) -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[bytes, dict]:
    """The status line and the JSON body of the response (then the connection is closed)."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                      .split(b":")[1])
        body = await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()
    return head.split(b"\r\n")[0], json.loads(body)


async def test_a_body_that_never_all_arrives_gets_408(limited):
    status, body = await answer(*await raw_request(limited.url, completions_head(100), b'{"prompt": "Hi"'))
    assert status == b"HTTP/1.1 408 Request Timeout"
    error = body["error"]
    assert "did not arrive within 0.5 s" in error["message"] and "15 bytes came" in error["message"]
    assert limited.cluster.p.requests == [] and limited.cluster.gateway.core.in_flight == 0
    assert (await limited.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})).status_code == 200


async def test_a_body_declared_past_the_limit_gets_its_413_at_once_before_any_body_is_sent(front):
    """The default body timeout (30 s) is not waited out: the headers alone are answered."""
    started = asyncio.get_running_loop().time()
    status, body = await answer(*await raw_request(front.url, completions_head(64 << 20), b""))
    assert asyncio.get_running_loop().time() - started < 3
    assert status == b"HTTP/1.1 413 Request Entity Too Large" and body["error"]["code"] == "request_too_large"
    assert front.cluster.p.requests == []


async def test_a_request_with_both_content_length_and_transfer_encoding_gets_400(front):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n")
    status, body = await answer(*await raw_request(front.url, head, b"0\r\n\r\n"))
    assert status.startswith(b"HTTP/1.1 400")
    assert "both Content-Length and Transfer-Encoding" in body["error"]["message"]
    assert front.cluster.p.requests == []


async def until(check, timeout_s: float = 10.0):
    """``await check()`` until it returns a truthy value (then that value)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.05)
    return value


async def _is(code, expected) -> bool:
    return await code == expected


async def test_past_http_max_connections_a_request_gets_503(limited):
    async def health() -> int:
        async with httpx.AsyncClient(base_url=limited.url) as client:
            return (await client.get("/health")).status_code

    idle = [await raw_request(limited.url, b"", b"") for _ in range(3)]
    try:
        await until(lambda: _is(health(), 503))
    finally:
        for _, writer in idle:
            writer.close()
    await until(lambda: _is(health(), 200))


def test_limits_must_not_be_negative():
    base = {"prefill": "127.0.0.1:1", "decode": "127.0.0.1:2"}
    for name in ("http_max_connections", "http_body_timeout_s"):
        with pytest.raises(ValueError, match=name):
            GatewayConfig(**base, **{name: -1})
    assert GatewayConfig(**base, http_max_connections=0, http_body_timeout_s=0)

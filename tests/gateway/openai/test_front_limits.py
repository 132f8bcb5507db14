"""Limits on what clients hold at the gateway: a body that never all arrives gets 408 and frees its request;
past ``max_concurrent_rpcs`` gRPC calls (those still sending their request included) get
RESOURCE_EXHAUSTED; past ``http_max_connections`` an HTTP request gets 503. Each limit lets the next
client in once the holders leave."""

from __future__ import annotations

import asyncio
import json

import grpc
import grpc.aio
import httpx
import pytest
from pdserve.v1 import gateway_pb2

from services.gateway.config import GatewayConfig
from tests.gateway.openai.conftest import start_front, stop_front


@pytest.fixture
async def limited(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, http_body_timeout_s=0.5, max_concurrent_rpcs=3,
                              http_max_connections=3)
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


async def test_a_body_that_never_all_arrives_gets_408(limited):
    reader, writer = await raw_request(limited.url, completions_head(100), b'{"prompt": "Hi"')
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                      .split(b":")[1])
        body = await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 408")
    error = json.loads(body)["error"]
    assert "did not arrive within 0.5 s" in error["message"] and "15 bytes came" in error["message"]
    assert limited.cluster.p.requests == [] and limited.cluster.gateway.core.in_flight == 0
    assert (await limited.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})).status_code == 200


async def until(check, timeout_s: float = 10.0):
    """``await check()`` until it returns a truthy value (then that value)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.05)
    return value


async def test_past_max_concurrent_rpcs_a_call_is_refused_until_the_holders_leave(limited):
    hold = asyncio.Event()

    async def never():
        await hold.wait()
        yield b""

    async def status_code() -> grpc.StatusCode:
        try:
            await limited.cluster.stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK

    calls = [limited.cluster.channel.stream_stream("/pdserve.v1.Gateway/Generate")(never()) for _ in range(4)]
    done, _ = await asyncio.wait([asyncio.ensure_future(call.code()) for call in calls], timeout=10,
                                 return_when=asyncio.FIRST_COMPLETED)
    assert [task.result() for task in done] == [grpc.StatusCode.RESOURCE_EXHAUSTED]  # one past the limit of 3
    await asyncio.sleep(0.2)
    assert sum(call.done() for call in calls) == 1  # the other three hold their slots: no request yet
    for call in calls:
        call.cancel()
    await until(lambda: _is(status_code(), grpc.StatusCode.OK))


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
    for name in ("max_concurrent_rpcs", "http_max_connections", "http_body_timeout_s"):
        with pytest.raises(ValueError, match=name):
            GatewayConfig(**base, **{name: -1})
    assert GatewayConfig(**base, max_concurrent_rpcs=0, http_max_connections=0, http_body_timeout_s=0)

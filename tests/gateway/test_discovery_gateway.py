"""The in-process gateway with ``--decode dns:///NAME:PORT`` over real gRPC fake nodes: requests follow the
fake DNS answer, and a request in flight on a node that leaves the answer still finishes there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc.aio
from pdserve.v1 import decode_pb2, gateway_pb2, gateway_pb2_grpc

from services.gateway.config import GatewayConfig
from services.gateway.main import assemble
from tests.gateway.conftest import MAX_MODEL_LEN
from tests.gateway.fakes import FakeDecode, FakePrefill, eventually
from tests.gateway.test_discovery_directory import NAME, FakeDns, port_of, serve_at


async def generate(stub: gateway_pb2_grpc.GatewayStub, request_id: str) -> list[gateway_pb2.GenerateResponse]:
    request = gateway_pb2.GenerateRequest(request_id=request_id, prompt="Hello",
                                          sampling=gateway_pb2.SamplingParams(max_tokens=4, temperature=0))
    return [r async for r in stub.Generate(request, timeout=10)]


async def decode_nodes(stub: gateway_pb2_grpc.GatewayStub) -> list[str]:
    status = await stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
    return sorted(n.address for n in status.nodes if n.role == "decode" and n.healthy)


async def test_requests_follow_the_dns_answer_and_in_flight_ones_finish(tokenizer, model_config):
    prefill, d1, d2 = FakePrefill(), FakeDecode(tokens=(5, 6, 7)), FakeDecode(tokens=(5, 6, 7))
    await prefill.start()
    await serve_at(d1, "127.0.0.1")
    dns = FakeDns("127.0.0.1")
    config = GatewayConfig(listen="127.0.0.1:0", prefill=prefill.address, decode=f"dns:///{NAME}:{port_of(d1)}",
                           max_model_len=MAX_MODEL_LEN, poll_interval_s=0.1, resolve_interval_s=0.1,
                           status_max_age_s=0.0, grace_s=0.5, log_level="warning")
    gateway = assemble(config, tokenizer, vocab_size=model_config.vocab_size,
                       max_position=model_config.max_position, resolver=dns)
    await gateway.start()
    channel = grpc.aio.insecure_channel(gateway.server.address)
    stub = gateway_pb2_grpc.GatewayStub(channel)
    try:
        assert (await generate(stub, "a"))[0].decode_node == d1.address

        await serve_at(d2, "127.0.0.2", port_of(d1))  # a new decode pod: same port, its own IP
        d1.status.blocks_free = 10  # fewer free blocks than d2: the router ranks d2 first once it sees it
        assert (await generate(stub, "b"))[0].decode_node == d1.address  # not in the answer yet
        dns.answer = ["127.0.0.1", "127.0.0.2"]
        await eventually_async(lambda: decode_nodes(stub), [d1.address, d2.address])
        assert (await generate(stub, "c"))[0].decode_node == d2.address

        async def held(request, context):
            await d1.hold.wait()
            yield decode_pb2.TokenEvent(token_ids=(8, 9, 10), finish_reason="length")

        d1.script, d1.status.blocks_free = held, 100
        d2.status.blocks_free = 10  # now d1 is first
        await eventually(lambda: [n.address for n in gateway.directory.nodes("decode")
                                  if n.blocks_free == 100] == [d1.address], what="the new counters polled")
        call = stub.Generate(gateway_pb2.GenerateRequest(
            request_id="long", prompt="Hello", sampling=gateway_pb2.SamplingParams(max_tokens=4)), timeout=10)
        first = await call.read()
        assert first.decode_node == d1.address
        await eventually(lambda: "long" in d1.attaches, what="the attach on d1")

        dns.answer = ["127.0.0.2"]  # d1 leaves the answer while "long" runs on it
        await eventually_async(lambda: decode_nodes(stub), [d2.address])
        assert (await generate(stub, "d"))[0].decode_node == d2.address
        d1.hold.set()
        rest = []
        while (response := await call.read()) is not grpc.aio.EOF:
            rest.append(response)
        assert rest[-1].finish_reason == "length" and [t for r in rest for t in r.token_ids] == [8, 9, 10]
        assert d1.aborts == [] and "long" not in d1.cancelled
    finally:
        await channel.close()
        await gateway.stop()
        await gateway.core.wait_background()
        d1.hold.set()
        for node in (prefill, d1, d2):
            await node.stop()


async def eventually_async(read: Callable[[], Awaitable[object]], expected: object, timeout_s: float = 3.0) -> None:
    """Poll the async ``read()`` until it returns ``expected``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (seen := await read()) != expected:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"expected {expected}, last saw {seen}")
        await asyncio.sleep(0.02)

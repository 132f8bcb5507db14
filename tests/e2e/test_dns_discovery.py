"""Gateway discovery of decode nodes by DNS re-resolution, with real prefill and decode processes.

The gateway (assembled in-process, as ``python -m services.gateway`` does) is given
``--decode dns:///decode.pdserve.test:PORT`` and a resolver whose answer the test changes, as a Kubernetes
headless service's answer changes when pods come and go. A DNS name's pods share one port and differ by
IP, so D1 serves on 127.0.0.1:PORT and D2 on 127.0.0.2:PORT.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator

import grpc.aio
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.launch import ServiceProcess, launch
from services.engine.model_files import bundled_model_path
from services.engine.tokenizer import Tokenizer
from services.engine.weights import load_model_config
from services.gateway.config import GatewayConfig
from services.gateway.main import Gateway, assemble
from tests.e2e.conftest import ENGINE_ARGS, greedy

pytestmark = pytest.mark.slow

NAME = "decode.pdserve.test"
INTERVAL_S = 0.2
PROMPT = "The capital of France is"


class FakeDns:
    """The test's DNS: ``answer`` is what NAME resolves to now."""

    def __init__(self, *ips: str) -> None:
        self.answer = list(ips)

    async def __call__(self, host: str, port: int) -> list[str]:
        if host != NAME:
            raise OSError(f"{host}: Name or service not known")
        return list(self.answer)


@contextlib.asynccontextmanager
async def in_process_gateway(prefill: str, decode_port: int, dns: FakeDns) -> AsyncIterator[Gateway]:
    path = bundled_model_path()
    model = load_model_config(path)
    config = GatewayConfig(listen="127.0.0.1:0", prefill=prefill, decode=f"dns:///{NAME}:{decode_port}",
                           resolve_interval_s=INTERVAL_S, poll_interval_s=INTERVAL_S, status_max_age_s=0.0,
                           grace_s=1.0, log_level="warning",
                           routing="load")  # ties rotate, so a joining node is served at once
    gateway = assemble(config, Tokenizer.load(path, model.eos_token_ids), vocab_size=model.vocab_size,
                       max_position=model.max_position, resolver=dns)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()
        await gateway.core.wait_background()


async def generate(stub: gateway_pb2_grpc.GatewayStub, max_tokens: int = 8) -> tuple[list[int], str]:
    """(token ids, the decode node that served them)."""
    tokens, decode_node = [], ""
    async for response in stub.Generate(gateway_pb2.GenerateRequest(prompt=PROMPT, sampling=greedy(max_tokens)),
                                        timeout=120):
        tokens += response.token_ids
        decode_node = decode_node or response.decode_node
    return tokens, decode_node


async def decode_nodes(stub: gateway_pb2_grpc.GatewayStub) -> dict[str, bool]:
    """ClusterStatus's decode nodes: address → healthy."""
    status = await stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10)
    return {n.address: n.healthy for n in status.nodes if n.role == "decode"}


async def wait_for_decode_nodes(stub: gateway_pb2_grpc.GatewayStub, expected: dict[str, bool],
                                timeout_s: float) -> float:
    """Seconds until ClusterStatus lists exactly ``expected``; fails after ``timeout_s``."""
    started = time.monotonic()
    while (seen := await decode_nodes(stub)) != expected:
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"ClusterStatus decode nodes {seen}, expected {expected} within {timeout_s}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def serving(node: ServiceProcess) -> str:
    return await asyncio.to_thread(node.wait_serving, 120)


async def test_gateway_finds_a_new_decode_node_and_drops_a_vanished_one_by_dns_re_resolution():
    with contextlib.ExitStack() as stack:
        def start(*args: str, host: str = "127.0.0.1") -> ServiceProcess:
            return stack.enter_context(launch(*args, *ENGINE_ARGS, host=host, wait=False,
                                              stderr=subprocess.DEVNULL))

        prefill = start("services.prefill_node")
        d1 = start("services.decode_node")
        await asyncio.gather(serving(prefill), serving(d1))
        port = int(d1.address.rpartition(":")[2])
        # The second decode pod: same port, its own IP (the later --listen wins over launch's own).
        d2 = start("services.decode_node", "--listen", f"127.0.0.2:{port}", host="127.0.0.2")
        dns = FakeDns("127.0.0.1")
        async with (in_process_gateway(prefill.address, port, dns) as gateway,
                    grpc.aio.insecure_channel(gateway.server.address) as channel):
            await scenario(gateway_pb2_grpc.GatewayStub(channel), d1, d2, dns)


async def scenario(stub: gateway_pb2_grpc.GatewayStub, d1: ServiceProcess, d2: ServiceProcess, dns: FakeDns) -> None:
    """D1 alone; D2 joins the answer; D1 leaves it."""
    assert await decode_nodes(stub) == {d1.address: True}
    expected, node = await generate(stub)
    assert node == d1.address and len(expected) == 8

    assert await serving(d2) == d1.address.replace("127.0.0.1:", "127.0.0.2:")
    assert await decode_nodes(stub) == {d1.address: True}  # up, but not in the answer yet
    dns.answer = ["127.0.0.1", "127.0.0.2"]
    joined_s = await wait_for_decode_nodes(stub, {d1.address: True, d2.address: True}, timeout_s=10)
    # re-resolved on its interval (~0.5 s here with the handshake to D2), not only at start: a bound loose enough for
    # a loaded machine (1.4 s was ~2.5x what a loaded CI machine needs)
    assert joined_s < 15 * INTERVAL_S, f"D2 listed {joined_s:.2f}s after the answer changed"
    served = [await generate(stub) for _ in range(4)]  # D2 has as many free blocks as D1, or more: ties rotate
    nodes = {node for _, node in served}
    assert d2.address in nodes and nodes <= {d1.address, d2.address}, served
    assert all(tokens == expected for tokens, _ in served)

    dns.answer = ["127.0.0.2"]  # D1's pod goes away: it is still up, but no longer in the answer
    await wait_for_decode_nodes(stub, {d2.address: True}, timeout_s=5)
    served = [await generate(stub) for _ in range(3)]
    assert [node for _, node in served] == [d2.address] * 3
    assert all(tokens == expected for tokens, _ in served)

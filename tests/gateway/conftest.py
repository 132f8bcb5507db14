"""The real tokenizer of the bundled model (loaded once; no weights) and an in-process gateway over fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc.aio
import pytest
from pdserve.v1 import gateway_pb2_grpc

from services.gateway.config import GatewayConfig
from services.gateway.main import Gateway, assemble
from services.gateway.model_check import ModelIdentity
from tests.gateway.fakes import FakeDecode, FakePrefill

MAX_MODEL_LEN = 512


@pytest.fixture(scope="session")
def model_config():
    from services.engine.model_files import bundled_model_path
    from services.engine.weights import load_model_config

    return load_model_config(bundled_model_path())


@pytest.fixture(scope="session")
def tokenizer(model_config):
    from services.engine.model_files import bundled_model_path
    from services.engine.tokenizer import Tokenizer

    return Tokenizer.load(bundled_model_path(), model_config.eos_token_ids)


@dataclass
class Cluster:
    gateway: Gateway
    stub: gateway_pb2_grpc.GatewayStub
    prefill: list[FakePrefill]
    decode: list[FakeDecode]
    channel: grpc.aio.Channel

    @property
    def p(self) -> FakePrefill:
        return self.prefill[0]

    @property
    def d(self) -> FakeDecode:
        return self.decode[0]


async def start_cluster(tokenizer, model_config, num_prefill: int = 1, num_decode: int = 1,
                        model: ModelIdentity | None = None, model_path=None, **settings) -> Cluster:
    """``model``: the identity nodes are checked against; ``model_path``: the gateway's ``--model``."""
    prefill = [FakePrefill() for _ in range(num_prefill)]
    decode = [FakeDecode() for _ in range(num_decode)]
    for node in (*prefill, *decode):
        await node.start()
    values = {"listen": "127.0.0.1:0", "prefill": ",".join(p.address for p in prefill),
              "decode": ",".join(d.address for d in decode), "max_model_len": MAX_MODEL_LEN,
              "poll_interval_s": 0.1, "status_max_age_s": 0.0, "abort_timeout_s": 1.0, "grace_s": 0.5,
              "log_level": "warning"}
    values.update(settings)
    if model_path is not None:
        values["model"] = model_path
    config = GatewayConfig(**values)
    gateway = assemble(config, tokenizer, vocab_size=model_config.vocab_size,
                       max_position=model_config.max_position, model=model, hidden_size=model_config.hidden_size)
    await gateway.start()
    channel = grpc.aio.insecure_channel(gateway.server.address)
    return Cluster(gateway, gateway_pb2_grpc.GatewayStub(channel), prefill, decode, channel)


async def stop_cluster(cluster: Cluster) -> None:
    await cluster.channel.close()
    await cluster.gateway.stop()
    await cluster.gateway.core.wait_background()
    for decode in cluster.decode:
        decode.hold.set()
    for node in (*cluster.prefill, *cluster.decode):
        await node.stop()


@pytest.fixture
async def cluster(tokenizer, model_config) -> AsyncIterator[Cluster]:
    running = await start_cluster(tokenizer, model_config)
    try:
        yield running
    finally:
        await stop_cluster(running)

"""The in-process gateway over fake nodes with its HTTP front on 127.0.0.1:0, and clients for it: raw
``httpx`` and the official ``openai`` package (no retries, so a 503 is seen as it is)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.gateway.conftest import Cluster, start_cluster, stop_cluster

MODEL = "SmolLM2-135M-Instruct"
MAX_BODY_MIB = 1.0


@dataclass
class Front:
    cluster: Cluster
    url: str
    http: httpx.AsyncClient  # base_url = the front
    client: openai.AsyncOpenAI  # base_url = the front's /v1


async def start_front(tokenizer, model_config, **settings) -> Front:
    values = {"http_listen": "127.0.0.1:0", "http_max_body_mib": MAX_BODY_MIB, **settings}
    cluster = await start_cluster(tokenizer, model_config, **values)
    assert cluster.gateway.http is not None
    url = cluster.gateway.http.url
    return Front(cluster, url, httpx.AsyncClient(base_url=url, timeout=10),
                 openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10))


async def stop_front(front: Front) -> None:
    try:
        await front.client.close()
        await front.http.aclose()
    finally:
        await stop_cluster(front.cluster)


@pytest.fixture
async def front(tokenizer, model_config) -> AsyncIterator[Front]:
    running = await start_front(tokenizer, model_config)
    try:
        yield running
    finally:
        await stop_front(running)

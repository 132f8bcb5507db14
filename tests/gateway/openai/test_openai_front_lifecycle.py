"""The HTTP front's life around requests: a client that leaves cancels its request on the nodes, the drain
refuses new requests while streams in flight finish, the gRPC path's metrics and root span, discovery of
the bound URL, and startup failures."""

from __future__ import annotations

import asyncio
import json
import socket

import grpc.aio
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pdserve.v1 import decode_pb2, gateway_pb2, gateway_pb2_grpc

from services.common import tracing
from services.gateway.config import GatewayConfig
from services.gateway.main import assemble
from services.gateway.metrics import GatewayMetrics
from tests.gateway.fakes import FakeDecode, FakePrefill, eventually
from tests.gateway.openai.conftest import MODEL, Front, start_front, stop_front
from tests.gateway.openai.test_openai_front_api import TEXT, script
from tests.gateway.openai.test_openai_front_errors import assert_serving


def stall_after_two(front: Front, tokenizer, until: asyncio.Event | None = None) -> list[int]:
    """D sends two tokens, then waits for ``until`` (forever when None) before the rest."""
    ids = tokenizer.encode(TEXT)
    front.cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:3])
        await (until or asyncio.Event()).wait()
        yield decode_pb2.TokenEvent(token_ids=ids[3:], finish_reason="length")

    front.cluster.d.script = attach
    return ids


def sample(front: Front, name: str, **labels: str) -> float:
    metrics = front.cluster.gateway.servicer.metrics
    assert isinstance(metrics, GatewayMetrics)
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_client_leaving_a_stream_aborts_the_request_on_both_nodes(front, tokenizer):
    stall_after_two(front, tokenizer)
    async with front.http.stream("POST", "/v1/completions", json={"prompt": "Hi", "stream": True}) as reply:
        events: list[str] = []  # P's first token, then D's first tokens
        async for line in reply.aiter_lines():
            events += [line] if line else []
            if len(events) == 2:
                break
    request_id = json.loads(events[0].removeprefix("data: "))["id"]  # the response is closed: the client is gone
    assert front.cluster.d.attaches == [request_id]
    await eventually(lambda: front.cluster.d.aborts == [request_id], what="Abort on the decode node")
    await eventually(lambda: front.cluster.d.cancelled == [request_id], what="Attach cancelled")
    await eventually(lambda: front.cluster.gateway.core.in_flight == 0, what="the flow closed")
    assert sample(front, "pdserve_requests_total", outcome="cancelled") == 1
    await assert_serving(front, tokenizer)


async def test_a_client_leaving_before_the_answer_aborts_the_request(front, tokenizer):
    stall_after_two(front, tokenizer)
    waiting = asyncio.ensure_future(front.http.post("/v1/chat/completions",
                                                    json={"messages": [{"role": "user", "content": "Hi"}]}))
    await eventually(lambda: front.cluster.d.attaches != [], what="the request on the decode node")
    waiting.cancel()  # closes the connection
    await eventually(lambda: len(front.cluster.d.aborts) == 1, what="Abort on the decode node")
    assert front.cluster.d.aborts == front.cluster.d.attaches and front.cluster.d.aborts[0].startswith("chatcmpl-")
    await eventually(lambda: front.cluster.gateway.core.in_flight == 0, what="the flow closed")
    await assert_serving(front, tokenizer)


async def test_the_drain_refuses_new_requests_while_a_stream_finishes(front, tokenizer):
    release = asyncio.Event()
    ids = stall_after_two(front, tokenizer, until=release)
    async with front.http.stream("POST", "/v1/completions", json={"prompt": "Hi", "stream": True}) as reply:
        lines = reply.aiter_lines()
        assert (await anext(lines)).startswith("data: ")
        stopping = asyncio.ensure_future(front.cluster.gateway.stop())
        await eventually(lambda: front.cluster.gateway.core.draining, what="the drain")
        async with httpx.AsyncClient(base_url=front.url) as other:
            refused = await other.post("/v1/completions", json={"prompt": "Hi"})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "service_unavailable"
            assert (await other.get("/health")).status_code == 503
        release.set()
        events = [line.removeprefix("data: ") async for line in lines if line]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert json.loads(events[-2])["choices"][0]["text"] == tokenizer.decode(ids[3:])
    await stopping
    async with httpx.AsyncClient(base_url=front.url) as late:
        with pytest.raises(httpx.ConnectError):
            await late.get("/health")  # the listener is closed


async def test_http_requests_count_in_the_gateway_metrics(front, tokenizer):
    ids = script(front, tokenizer)
    await front.client.completions.create(model=MODEL, prompt="Hi", max_tokens=len(ids))
    stream = await front.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                        stream=True)
    [_ async for _ in stream]
    await front.http.post("/v1/completions", json={"prompt": "Hi", "stop": [""]})  # refused by the gateway
    assert sample(front, "pdserve_requests_total", outcome="length") == 2
    assert sample(front, "pdserve_requests_total", outcome="invalid_argument") == 1
    assert sample(front, "pdserve_request_ttft_seconds_count") == 2
    assert sample(front, "pdserve_request_generation_tokens_total") == 2 * len(ids)
    assert sample(front, "pdserve_requests_in_flight") == 0


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    assert tracing.setup_tracing("pdserve-test", exporter=exporter)
    yield exporter
    tracing.shutdown_tracing()


async def test_an_http_request_is_a_generate_trace_continuing_the_callers(front, tokenizer, spans):
    script(front, tokenizer)
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    completion = await front.client.completions.create(
        model=MODEL, prompt="Hi", extra_headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    await eventually(lambda: any(s.name == "Generate" for s in spans.get_finished_spans()), what="the span")
    by_name = {s.name: s for s in spans.get_finished_spans()}
    root = by_name["Generate"]
    assert format(root.context.trace_id, "032x") == trace_id and format(root.parent.span_id, "016x") == parent_id
    assert root.attributes[tracing.REQUEST_ID] == completion.id
    for child in ("tokenize", "route", "detokenize"):
        assert by_name[child].parent.span_id == root.context.span_id, child


async def test_cluster_status_names_the_http_url(front, cluster):
    for running, expected in ((front.cluster, front.url), (cluster, "")):
        stub = gateway_pb2_grpc.GatewayStub(running.channel)
        status = await stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5)
        assert status.http_url == expected
    assert front.url.startswith("http://127.0.0.1:") and not front.url.endswith(":0")


def test_http_settings_are_checked():
    base = {"prefill": "127.0.0.1:1", "decode": "127.0.0.1:2"}
    assert GatewayConfig(**base).http_listen == ""  # off unless asked for
    for bad in ({"http_listen": "8000"}, {"http_listen": "localhost:http"}, {"http_max_body_mib": 0},
                {"max_request_mib": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GatewayConfig(**base, **bad)


async def test_a_taken_http_port_fails_the_start_and_stops_the_grpc_server(tokenizer, model_config):
    prefill, decode = FakePrefill(), FakeDecode()
    for node in (prefill, decode):
        await node.start()
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            config = GatewayConfig(listen="127.0.0.1:0", prefill=prefill.address, decode=decode.address,
                                   http_listen=f"127.0.0.1:{port}", grace_s=0.1, log_level="warning")
            gateway = assemble(config, tokenizer, vocab_size=model_config.vocab_size,
                               max_position=model_config.max_position)
            health_while_binding_http = []
            bind_http = gateway.http.start

            async def start_http() -> None:
                async with grpc.aio.insecure_channel(gateway.server.address) as channel:
                    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                health_while_binding_http.append(reply.status)
                await bind_http()

            gateway.http.start = start_http
            with pytest.raises(OSError, match=f"cannot bind the HTTP front 127.0.0.1:{port}"):
                await gateway.start()
        # a launcher waiting for SERVING never took this gateway for a ready one
        assert health_while_binding_http == [health_pb2.HealthCheckResponse.NOT_SERVING]
        assert gateway.server.stopping or gateway.server._shutdown_task is not None
        async with grpc.aio.insecure_channel(gateway.server.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError):  # nothing serves gRPC there any more
                await gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(),
                                                                          timeout=1)
    finally:
        for node in (prefill, decode):
            await node.stop()


async def test_served_model_name_is_what_requests_name(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, served_model_name="smol")
    try:
        assert [m.id for m in (await front.client.models.list()).data] == ["smol"]
        script(front, tokenizer)
        assert (await front.client.completions.create(model="smol", prompt="Hi")).model == "smol"
        assert (await front.http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"})).status_code == 404
    finally:
        await stop_front(front)

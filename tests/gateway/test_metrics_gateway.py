"""The gateway's /metrics: request latency histograms and outcomes as calls run through the in-process
gateway over fake nodes, and the tracker's arithmetic on a fake clock."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from pdserve.v1 import gateway_pb2, prefill_pb2
from prometheus_client import CollectorRegistry

from services.common.errors import UnavailableError
from services.gateway.generation import GenerateChunk, Usage
from services.gateway.metrics import GatewayMetrics, RequestTracker, outcome_of
from tests.common.test_metrics_endpoint import scrape, value
from tests.gateway.test_generate import collect, request, script_tokens, stall_after


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def response(tokens: int, finish_reason: str = "", completion: int = 0) -> GenerateChunk:
    usage = Usage(prompt_tokens=30, completion_tokens=completion, cached_tokens=16) if finish_reason else None
    return GenerateChunk("", tuple(range(tokens)), "", finish_reason, usage)


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_ttft_tpot_and_e2e_of_one_request():
    metrics, clock = GatewayMetrics(CollectorRegistry()), Clock()
    with RequestTracker(metrics, clock) as tracker:
        assert sample(metrics, "pdserve_requests_in_flight") == 1
        clock.now += 0.25
        tracker.sent(response(1))  # the first token, 250 ms in
        clock.now += 0.5
        tracker.sent(response(3))
        clock.now += 0.5
        tracker.sent(response(2, "length", completion=6))  # 5 tokens after the first in 1 s
    assert sample(metrics, "pdserve_requests_in_flight") == 0
    assert sample(metrics, "pdserve_request_ttft_seconds_sum") == pytest.approx(0.25)
    assert sample(metrics, "pdserve_request_ttft_seconds_bucket", le="0.3") == 1
    assert sample(metrics, "pdserve_request_ttft_seconds_bucket", le="0.2") == 0
    assert sample(metrics, "pdserve_request_tpot_seconds_sum") == pytest.approx(0.2)
    assert sample(metrics, "pdserve_request_e2e_seconds_sum") == pytest.approx(1.25)
    assert sample(metrics, "pdserve_requests_total", outcome="length") == 1
    assert (sample(metrics, "pdserve_request_prompt_tokens_total"),
            sample(metrics, "pdserve_request_cached_tokens_total"),
            sample(metrics, "pdserve_request_generation_tokens_total")) == (30, 16, 6)


def test_a_call_that_ends_without_a_finish_reason_counts_its_status_code():
    metrics = GatewayMetrics(CollectorRegistry())
    with pytest.raises(UnavailableError), RequestTracker(metrics) as tracker:
        tracker.sent(response(1))
        raise UnavailableError("decode node failed")
    assert sample(metrics, "pdserve_requests_total", outcome="unavailable") == 1
    assert sample(metrics, "pdserve_request_ttft_seconds_count") == 1
    assert sample(metrics, "pdserve_request_e2e_seconds_count") == 0  # only finished requests
    assert sample(metrics, "pdserve_request_tpot_seconds_count") == 0
    assert outcome_of(asyncio.CancelledError()) == outcome_of(GeneratorExit()) == "cancelled"
    assert outcome_of(ValueError("a bug")) == "unknown"


async def test_requests_through_the_gateway_move_its_metrics(cluster, tokenizer):
    status = await cluster.stub.ClusterStatus(gateway_pb2.ClusterStatusRequest())
    url = status.gateway_metrics_url
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert all(node.metrics_url == "" for node in status.nodes)  # the fakes export none
    before = await asyncio.to_thread(scrape, url)
    assert value(before, "pdserve_gateway_nodes", role="prefill", state="healthy") == 1
    assert value(before, "pdserve_gateway_nodes", role="decode", state="healthy") == 1
    assert value(before, "pdserve_gateway_nodes", role="cache_store", state="healthy") == 0
    assert value(before, "pdserve_request_ttft_seconds_count") == 0

    ids = script_tokens(cluster, tokenizer)
    for _ in range(2):
        await collect(cluster, request(temperature=0.0, max_tokens=len(ids)))
    with pytest.raises(grpc.aio.AioRpcError):  # bad input: counted, never timed
        await collect(cluster, request(max_tokens=0))

    async def refuse(request, context):
        yield prefill_pb2.PrefillEvent(refused=prefill_pb2.Refused(decode_address=cluster.d.address))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "every decode candidate refused")

    cluster.p.script = refuse
    with pytest.raises(grpc.aio.AioRpcError):
        await collect(cluster, request())

    after = await asyncio.to_thread(scrape, url)
    assert value(after, "pdserve_request_ttft_seconds_count") == 2
    assert value(after, "pdserve_request_e2e_seconds_count") == 2
    assert value(after, "pdserve_request_tpot_seconds_count") == 2
    assert value(after, "pdserve_requests_total", outcome="length") == 2
    assert value(after, "pdserve_requests_total", outcome="invalid_argument") == 1
    assert value(after, "pdserve_requests_total", outcome="resource_exhausted") == 1
    assert value(after, "pdserve_request_generation_tokens_total") == 2 * len(ids)
    assert value(after, "pdserve_request_prompt_tokens_total") == 2 * len(tokenizer.encode("Hello there"))
    assert value(after, "pdserve_requests_in_flight") == 0


async def test_a_client_that_goes_away_is_counted_cancelled(cluster, tokenizer):
    ids = tokenizer.encode(" one two three four")
    cluster.p.first_token = ids[0]
    stall_after(cluster, ids)
    call = cluster.stub.Generate(request(), timeout=10)
    await call.read()
    url = cluster.gateway.servicer.metrics_url
    assert value(await asyncio.to_thread(scrape, url), "pdserve_requests_in_flight") == 1
    call.cancel()
    for _ in range(100):
        samples = await asyncio.to_thread(scrape, url)
        if ("pdserve_requests_total", (("outcome", "cancelled"),)) in samples:
            break
        await asyncio.sleep(0.02)
    assert value(samples, "pdserve_requests_total", outcome="cancelled") == 1
    assert value(samples, "pdserve_requests_in_flight") == 0


async def test_a_call_whose_deadline_passes_is_counted_deadline_exceeded(cluster, tokenizer):
    ids = tokenizer.encode(" one two three four")
    cluster.p.first_token = ids[0]
    stall_after(cluster, ids)
    call = cluster.stub.Generate(request(), timeout=0.5)
    await call.read()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while await call.read() is not grpc.aio.EOF:
            pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    url = cluster.gateway.servicer.metrics_url
    for _ in range(100):
        samples = await asyncio.to_thread(scrape, url)
        if value(samples, "pdserve_requests_in_flight") == 0:
            break
        await asyncio.sleep(0.02)
    assert value(samples, "pdserve_requests_total", outcome="deadline_exceeded") == 1
    assert ("pdserve_requests_total", (("outcome", "cancelled"),)) not in samples


async def test_a_generate_call_whose_bytes_do_not_parse_is_counted_invalid_argument(cluster):
    metrics = cluster.gateway.servicer.metrics
    call = cluster.channel.unary_stream("/pdserve.v1.Gateway/Generate")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in call(b"\xff\xff\xff\xff\xff", timeout=5):
            pass
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("request: the bytes sent to /pdserve.v1.Gateway/Generate are not a valid")
    assert sample(metrics, "pdserve_requests_total", outcome="invalid_argument") == 1
    assert sample(metrics, "pdserve_requests_in_flight") == 0
    assert not cluster.p.requests

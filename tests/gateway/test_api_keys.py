"""API keys on the gateway's public ports: gRPC ``authorization: Bearer`` metadata and HTTP ``Authorization:
Bearer``; no key / a wrong key refused, the right one answered; health, reflection and /metrics open; a key
file rotated on disk without a restart; the keys never in the process's log."""

from __future__ import annotations

import asyncio
import signal

import grpc
import grpc.aio
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pdserve.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2, gateway_pb2_grpc

from services.bench.datasets import BenchRequest
from services.bench.grpc_target import GrpcTarget
from services.bench.openai_target import OpenAITarget
from services.bench.targets import SamplingSpec, TargetSpec
from services.client.__main__ import main as client_main
from services.common.launch import launch
from services.gateway.api_keys import ApiKeys, bearer, parse_key_file
from tests.gateway.openai.conftest import start_front, stop_front

KEYS = ("sk-first-0123456789", "sk-second-abcdef")
WRONG = "sk-wrong-zyxwvu"


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture
async def keyed(tokenizer, model_config):
    front = await start_front(tokenizer, model_config, api_key=",".join(KEYS))
    try:
        yield front
    finally:
        await stop_front(front)


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    return error.value


async def test_grpc_calls_need_a_configured_key(keyed):
    stub, request = keyed.cluster.stub, gateway_pb2.ClusterStatusRequest()
    assert "missing API key" in (await refused(stub.ClusterStatus(request, timeout=5))).details()
    wrong = await refused(stub.ClusterStatus(request, timeout=5, metadata=auth(WRONG)))
    assert wrong.details() == "invalid API key" and WRONG not in wrong.details()
    generate = stub.Generate(gateway_pb2.GenerateRequest(token_ids=[1, 2]), timeout=5, metadata=auth(WRONG))
    await refused(generate.read())
    assert keyed.cluster.p.requests == []
    for key in KEYS:
        status = await stub.ClusterStatus(request, timeout=5, metadata=auth(key))
        assert status.http_url == keyed.url and len(status.nodes) == 2
    replies = [r async for r in stub.Generate(gateway_pb2.GenerateRequest(token_ids=[1, 2]), timeout=5,
                                              metadata=auth(KEYS[1]))]
    assert replies[-1].finish_reason == "length"


async def test_admin_is_not_on_the_public_port_and_health_and_reflection_need_no_key(keyed):
    """Not even with a right key: the gateway serves ``Admin`` only on ``--admin-listen`` (test_admin_port)."""
    channel = keyed.cluster.channel
    for metadata in (None, auth(KEYS[0])):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await admin_pb2_grpc.AdminStub(channel).Drain(admin_pb2.DrainRequest(), timeout=5, metadata=metadata)
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert not keyed.cluster.gateway.server.stopping
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = [a async for a in reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)]
    assert "pdserve.v1.Gateway" in {s.name for s in answers[0].list_services_response.service}


async def test_http_api_paths_need_a_key_and_health_and_metrics_do_not(keyed):
    missing = await keyed.http.get("/v1/models")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["type"] == "invalid_request_error" and missing.json()["error"]["code"] is None
    wrong = await keyed.http.post("/tokenize", json={"prompt": "Hi"}, headers={"Authorization": f"Bearer {WRONG}"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert WRONG not in wrong.text
    right = await keyed.http.get("/v1/models", headers={"Authorization": f"Bearer {KEYS[0]}"})
    assert right.status_code == 200 and right.json()["data"][0]["id"] == "SmolLM2-135M-Instruct"
    assert (await keyed.http.get("/health")).status_code == 200
    metrics_url = keyed.cluster.gateway.server.metrics_url()
    async with httpx.AsyncClient() as client:
        assert (await client.get(metrics_url)).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        await keyed.client.models.list()  # the fixture's client sends "unused"
    async with openai.AsyncOpenAI(base_url=f"{keyed.url}/v1", api_key=KEYS[1], max_retries=0) as client:
        reply = await client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=2)
        assert reply.choices[0].finish_reason == "length"


async def test_a_key_file_rotated_on_disk_takes_effect_without_a_restart(tokenizer, model_config, tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# the gateway's keys\n\nsk-old-key\n")
    front = await start_front(tokenizer, model_config, api_key_file=key_file)
    try:
        async def status(key: str) -> int:
            return (await front.http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})).status_code

        assert await status("sk-old-key") == 200 and await status("sk-new-key") == 401
        key_file.write_text("sk-new-key\n")
        deadline = asyncio.get_running_loop().time() + 5
        while await status("sk-new-key") != 200:
            assert asyncio.get_running_loop().time() < deadline, "the new key was never taken"
            await asyncio.sleep(0.1)
        assert await status("sk-old-key") == 401
        await refused(front.cluster.stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5,
                                                       metadata=auth("sk-old-key")))
    finally:
        await stop_front(front)


def test_key_parsing_and_an_empty_key_file_refuses_everyone(tmp_path):
    assert parse_key_file("# c\n\n a \nb\n#d") == ("a", "b")
    assert bearer("Bearer  k ") == "k" and bearer("bearer k") == "k"
    assert bearer("Basic k") is None and bearer("Bearer") is None and bearer(None) is None
    empty = tmp_path / "keys"
    empty.write_text("# none yet\n")
    keys = ApiKeys((), empty)
    assert keys.enabled and keys.check("anything") == "invalid" and keys.check(None) == "missing"
    assert ApiKeys().check(None) is None
    with pytest.raises(ValueError, match="cannot read") as error:
        ApiKeys((), tmp_path / "absent")
    assert "absent" in str(error.value)


def test_the_gateway_process_checks_keys_and_never_logs_them(tmp_path):
    """``python -m services.gateway`` with ``PDSERVE_API_KEY`` (nodes that are not there: the gateway
    serves anyway), at debug level: the keys sent, right and wrong, appear nowhere in its output."""
    log_path = tmp_path / "stderr"
    args = ("--prefill", "127.0.0.1:9", "--decode", "127.0.0.1:10", "--http-listen", "127.0.0.1:0",
            "--log-level", "debug")
    with log_path.open("wb") as log, launch("services.gateway", *args, env={"PDSERVE_API_KEY": KEYS[0]},
                                            stdout=log.fileno(), stderr=log.fileno(), startup_timeout_s=60) as node:
        with grpc.insecure_channel(node.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            with pytest.raises(grpc.RpcError) as wrong:
                stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5, metadata=auth(WRONG))
            assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
            http_url = stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=5,
                                          metadata=auth(KEYS[0])).http_url
        assert httpx.get(f"{http_url}/v1/models", headers={"Authorization": f"Bearer {WRONG}"}).status_code == 401
        assert httpx.get(f"{http_url}/v1/models", headers={"Authorization": f"Bearer {KEYS[0]}"}).status_code == 200
        node.process.send_signal(signal.SIGTERM)
        assert node.process.wait(20) == 0
    output = log_path.read_text()
    assert "gateway ready" in output and "api_keys" in output  # the log was captured
    assert KEYS[0] not in output and WRONG not in output


async def test_the_client_and_the_bench_targets_send_a_key(keyed, monkeypatch):
    """``python -m services.client --api-key`` and the bench's gRPC and OpenAI targets (``PDSERVE_API_KEY``)."""
    address = keyed.cluster.gateway.server.address
    run = ["hi", "--address", address, "--max-tokens", "2", "--timeout", "5"]
    assert await asyncio.to_thread(client_main, [*run, "--api-key", KEYS[0]]) == 0
    assert await asyncio.to_thread(client_main, [*run, "--api-key", WRONG]) == 1
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("PDSERVE_API_KEY", f"{KEYS[1]},{KEYS[0]}")
    request = BenchRequest(prompt="Hi", prompt_ids=(1, 2), output_len=2, system="", group=0)
    grpc_target = GrpcTarget(TargetSpec.parse(f"grpc://{address}"), SamplingSpec())
    openai_target = await OpenAITarget.open(TargetSpec.parse(keyed.url), SamplingSpec())
    try:
        for target in (grpc_target, openai_target):
            outcome = await target.generate(request)
            assert outcome.ok and outcome.output_tokens >= 1, outcome.error
    finally:
        await grpc_target.close()
        await openai_target.close()
    monkeypatch.delenv("PDSERVE_API_KEY")
    keyless = GrpcTarget(TargetSpec.parse(f"grpc://{address}"), SamplingSpec())
    try:
        assert (await keyless.generate(request)).error.startswith("UNAUTHENTICATED")
    finally:
        await keyless.close()

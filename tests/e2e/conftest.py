"""Real clusters of real processes on loopback (gateway, prefill, decode, cache-store), the real model."""

from __future__ import annotations

import subprocess
import time

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.common.tls.ca import role_dns
from tests.tls_identities import session_root

# float32 so outputs can be compared token for token with the mixed engine; one torch thread per node
# (several model processes share this machine's two cores); a small KV pool.
ENGINE_ARGS = ("--dtype", "float32", "--threads", "1", "--num-kv-blocks", "512", "--max-num-batched-tokens", "256")
GATEWAY_ARGS = ("--poll-interval-s", "0.2", "--status-max-age-s", "0")


@pytest.fixture(scope="session")
def cluster():
    spec = ClusterSpec(engine_args=ENGINE_ARGS, gateway_args=GATEWAY_ARGS)
    with start_cluster(spec, stderr=subprocess.DEVNULL) as running:
        yield running


@pytest.fixture(scope="session")
def stub(cluster):
    with grpc.insecure_channel(cluster.address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


def grpcurl_security(role: str, holder: str = "test") -> list[str]:
    """grpcurl's flags to reach a node of ``role`` over mTLS as ``holder`` (a directory of the session CA,
    ``tests/conftest.py``; "test" holds every role, admin included); the gateway's public port (role
    "gateway" here) is plaintext."""
    if role == "gateway":
        return ["-plaintext"]
    held = session_root() / holder
    return ["-cacert", str(held / "ca.crt"), "-cert", str(held / "tls.crt"), "-key", str(held / "tls.key"),
            "-servername", role_dns(role)]


def generate(stub, timeout: float = 120.0, **fields) -> tuple[list[int], str, gateway_pb2.GenerateResponse]:
    """Run one Generate call to the end: (token ids, text, last message)."""
    tokens, text, last = [], "", None
    for response in stub.Generate(gateway_pb2.GenerateRequest(**fields), timeout=timeout):
        tokens += response.token_ids
        text += response.text
        last = response
    return tokens, text, last


def greedy(max_tokens: int, **extra) -> gateway_pb2.SamplingParams:
    return gateway_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)


def model_nodes(stub) -> list[gateway_pb2.NodeStatus]:
    nodes = stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10).nodes
    return [n for n in nodes if n.role in ("prefill", "decode")]


def wait_idle(stub, timeout_s: float = 20.0) -> list[gateway_pb2.NodeStatus]:
    """Poll ClusterStatus until every prefill and decode node holds nothing: no running or waiting
    request, nothing reserved, every block free or cached. Fails with the last numbers otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = model_nodes(stub)
        if all(is_idle(n) for n in nodes):
            return nodes
        if time.monotonic() > deadline:
            raise AssertionError(f"cluster not idle after {timeout_s}s: {nodes}")
        time.sleep(0.1)


def is_idle(node: gateway_pb2.NodeStatus) -> bool:
    return (node.healthy and node.requests_running == 0 and node.requests_waiting == 0
            and node.blocks_reserved == 0 and node.blocks_free + node.blocks_cached == node.blocks_total
            and node.calls_in_flight == 0)

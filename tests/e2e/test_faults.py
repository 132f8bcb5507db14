"""Peers dying or hanging: the client gets UNAVAILABLE, never a hang; a hung (stopped) node is found out by
keepalive pings within seconds, and what its calls held is freed once it runs again; a dead prefill node's
reservation expires on the decode node; a restarted node rejoins without restarting the gateway."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time

import grpc
import pytest
from pdserve.v1 import decode_pb2_grpc, gateway_pb2, gateway_pb2_grpc, node_pb2, prefill_pb2, prefill_pb2_grpc

from services.cluster.local import wait_until_polled
from services.common.launch import launch
from services.common.ports import unused_port
from services.common.tls.channels import open_sync_channel
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy

pytestmark = pytest.mark.slow
LEASE_MS = 1500
KEEPALIVE_ARGS = ("--keepalive-s", "1", "--keepalive-timeout-s", "1")
DECODE_ARGS = (*ENGINE_ARGS, "--lease-ms", str(LEASE_MS), *KEEPALIVE_ARGS)
PREFILL_ARGS = (*ENGINE_ARGS, "--max-num-batched-tokens", "32", *KEEPALIVE_ARGS)  # a long prompt: many steps


class Nodes:
    def __init__(self, stack: contextlib.ExitStack, *gateway_args: str):
        self.stack = stack
        # every process at once: the nodes on chosen ports, so the gateway is given their addresses
        self.decode = self.start("services.decode_node", *DECODE_ARGS, port=unused_port())
        self.prefill = self.start("services.prefill_node", *PREFILL_ARGS, port=unused_port())
        self.gateway = self.start("services.gateway", "--prefill", self.prefill.address, "--decode",
                                  self.decode.address, *GATEWAY_ARGS, *KEEPALIVE_ARGS, *gateway_args)
        for process in (self.decode, self.prefill, self.gateway):
            process.wait_serving(120)
        wait_until_polled(self.gateway.address, 2)
        self.stub = gateway_pb2_grpc.GatewayStub(stack.enter_context(grpc.insecure_channel(self.gateway.address)))

    def start(self, module: str, *args: str, port: int = 0):
        return self.stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL,
                                               wait=False, port=port))

    def decode_status(self) -> gateway_pb2.NodeStatus:
        with open_sync_channel(self.decode.address, "decode") as channel:
            return decode_pb2_grpc.DecodeNodeStub(channel).NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)

    def prefill_status(self) -> gateway_pb2.NodeStatus:
        with open_sync_channel(self.prefill.address, "prefill") as channel:
            return prefill_pb2_grpc.PrefillNodeStub(channel).NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)

    def healthy(self, role: str) -> bool:
        nodes = self.stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10).nodes
        return all(n.healthy for n in nodes if n.role == role)


@pytest.fixture(scope="module")
def nodes():
    with contextlib.ExitStack() as stack:
        yield Nodes(stack)


@pytest.fixture(scope="module")
def stale_nodes():
    """A gateway that polls its nodes once a minute: its view of their health lags a hang."""
    with contextlib.ExitStack() as stack:
        yield Nodes(stack, "--poll-interval-s", "60")


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def stopped(process: subprocess.Popen):
    """The process hangs (SIGSTOP) until the block ends: its sockets stay open, nothing answers."""
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def _idle(status: gateway_pb2.NodeStatus) -> bool:
    return (status.blocks_free + status.blocks_cached == status.blocks_total and status.blocks_reserved == 0
            and status.requests_running == status.requests_waiting == 0)


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_hung_node_fails_the_call_within_the_keepalive_and_frees_everything_once_it_runs(nodes, role):
    """Without keepalive the call waited for its 60 s deadline (forever without one)."""
    _hang_mid_request(nodes, role)


def test_the_only_prefill_node_hung_is_not_tried_again_while_the_gateway_still_thinks_it_healthy(stale_nodes):
    """A failure before the first token is retried, on the same prefill node when it is the only healthy one
    (it may have reported a decode node's failure). The gateway asks a node that failed so before trying it
    again: with a stale view of its health it sent the retry to the hung node and the call took ~20 s (a
    connection to a stopped process), past what keepalive promises."""
    _hang_mid_request(stale_nodes, "prefill")


def _hang_mid_request(nodes: Nodes, role: str) -> None:
    prompt, max_tokens = ("Tell me a long story.", 2000) if role == "decode" else (
        " ".join(f"word{i}" for i in range(1500)), 16)  # 6390 tokens: many prefill steps
    call = nodes.stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, sampling=greedy(max_tokens)),
                               timeout=60)
    if role == "decode":
        next(call), next(call)  # decoding
    else:
        _wait(lambda: nodes.prefill_status().requests_running > 0, 30, "the prefill to start")
    node = nodes.decode if role == "decode" else nodes.prefill
    with stopped(node.process):
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            for _ in call:
                pass
        assert time.monotonic() - started < 15
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    assert f"{role} node [internal]" in info.value.details()  # the role, never the address, to a client
    assert node.address not in info.value.details()
    _wait(lambda: _idle(nodes.decode_status()) and _idle(nodes.prefill_status()), 20, "both nodes to be idle")
    _wait(lambda: nodes.healthy(role), 20, f"the {role} node to be healthy again")
    _, text, last = generate(nodes.stub, prompt="The capital of France is", sampling=greedy(5))
    assert text.startswith(" Paris") and last.finish_reason == "length"


def test_decode_node_killed_mid_generation_gives_unavailable_and_it_rejoins_after_restart(nodes):
    call = nodes.stub.Generate(gateway_pb2.GenerateRequest(prompt="Tell me a long story.", sampling=greedy(2000)),
                               timeout=60)
    next(call), next(call)
    address = nodes.decode.address
    nodes.decode.process.kill()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    assert time.monotonic() - started < 15
    _wait(lambda: not nodes.healthy("decode"), 10, "the gateway to mark the dead decode node unhealthy")

    nodes.decode = nodes.start("services.decode_node", *DECODE_ARGS, "--listen", address)
    nodes.decode.wait_serving(120)
    _wait(lambda: nodes.healthy("decode"), 20, "the restarted decode node to rejoin")
    _, text, last = generate(nodes.stub, prompt="The capital of France is", sampling=greedy(5))
    assert text.startswith(" Paris") and last.finish_reason == "length"


def test_prefill_node_killed_after_reserving_lets_the_lease_expire(nodes, bundled_tokenizer):
    """Prefill is called directly (no gateway), so nothing but the lease can free the reservation."""
    idle = nodes.decode_status()
    assert idle.blocks_reserved == 0
    prompt_ids = bundled_tokenizer.encode(" ".join(f"word{i}" for i in range(1500)))
    request = prefill_pb2.PrefillRequest(request_id="doomed", prompt_token_ids=prompt_ids,
                                         sampling=gateway_pb2.SamplingParams(max_tokens=4, temperature=0, seed=1),
                                         decode_candidates=[nodes.decode.address])
    with open_sync_channel(nodes.prefill.address, "prefill") as channel:
        events = prefill_pb2_grpc.PrefillNodeStub(channel).Prefill(request, timeout=60)
        assert next(events).HasField("reserved")
        assert nodes.decode_status().blocks_reserved > 0
        nodes.prefill.process.kill()
        killed = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            for _ in events:
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    _wait(lambda: nodes.decode_status().blocks_reserved == 0, LEASE_MS / 1000 + 5, "the lease to expire")
    assert time.monotonic() - killed >= LEASE_MS / 1000 * 0.5  # freed by the lease, not at once
    after = nodes.decode_status()
    assert after.blocks_free + after.blocks_cached == after.blocks_total
    assert after.requests_running == after.requests_waiting == 0

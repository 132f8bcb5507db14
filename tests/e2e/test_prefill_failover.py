"""A prefill node that hangs (SIGSTOP) while it computes a prompt costs the client a few seconds, not its
request: keepalive finds the node out, the gateway aborts the attempt and runs the request on the other
prefill node, and the client gets the same greedy tokens as an undisturbed run. Once the hung node runs
again, every node is idle with no block held. Real processes, the real model."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc, node_pb2, prefill_pb2_grpc

from services.cluster.local import wait_until_polled
from services.common.launch import launch
from services.common.ports import unused_port
from services.common.tls.channels import open_sync_channel
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy, wait_idle
from tests.e2e.test_faults import KEEPALIVE_ARGS, stopped

pytestmark = pytest.mark.slow
PREFILL_ARGS = (*ENGINE_ARGS, "--max-num-batched-tokens", "32", *KEEPALIVE_ARGS)  # a long prompt: many steps
PROMPT = " ".join(f"item{i}" for i in range(500))  # about 2000 tokens: seconds of prefill


@pytest.fixture(scope="module")
def cluster():
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str):  # every process at once: the nodes on chosen ports
            return stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL,
                                              wait=False, port=0 if module == "services.gateway" else unused_port()))

        decode = start("services.decode_node", *ENGINE_ARGS, *KEEPALIVE_ARGS)
        prefill = [start("services.prefill_node", *PREFILL_ARGS) for _ in range(2)]
        gateway = start("services.gateway", "--prefill", ",".join(p.address for p in prefill),
                        "--decode", decode.address, *GATEWAY_ARGS, *KEEPALIVE_ARGS)
        for process in (decode, *prefill, gateway):
            process.wait_serving(120)
        wait_until_polled(gateway.address, 3)
        stub = gateway_pb2_grpc.GatewayStub(stack.enter_context(grpc.insecure_channel(gateway.address)))
        yield stub, prefill


def running(process) -> int:
    with open_sync_channel(process.address, "prefill") as channel:
        status = prefill_pb2_grpc.PrefillNodeStub(channel).NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)
    return status.requests_running


def test_a_prefill_node_hung_mid_prompt_is_replaced_and_the_client_gets_every_token(cluster):
    stub, prefill = cluster
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, sampling=greedy(8))
    result: dict[str, object] = {}

    def call() -> None:
        try:
            result["responses"] = list(stub.Generate(request, timeout=120))
        except grpc.RpcError as error:
            result["error"] = error

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 30
    while not (busy := [p for p in prefill if running(p) > 0]):
        assert time.monotonic() < deadline, "the prefill never started"
        time.sleep(0.05)
    hung, other = busy[0], next(p for p in prefill if p is not busy[0])
    with stopped(hung.process):
        stopped_at = time.monotonic()
        caller.join(90)
        took = time.monotonic() - stopped_at
    assert not caller.is_alive() and "error" not in result, result.get("error")
    responses = result["responses"]
    assert responses[0].prefill_node == other.address  # the first token came from the other node
    assert responses[-1].finish_reason == "length" and responses[-1].usage.completion_tokens == 8
    assert took < 60, f"{took:.1f} s: the hung node was not found out by keepalive"

    wait_idle(stub, timeout_s=30)  # the hung node let go of its attempt once it ran again; so did the decode node
    tokens, _, _ = generate(stub, prompt=PROMPT, sampling=greedy(8))
    assert [t for r in responses for t in r.token_ids] == tokens  # the retried request's tokens are the real ones

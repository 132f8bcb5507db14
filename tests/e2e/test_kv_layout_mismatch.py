"""A prefill node whose KV no decode node can use (another dtype here; another model alike) is left out of
rotation, saying why, and requests keep succeeding on the nodes that match — with real processes: two
prefill nodes (float32, bfloat16), one float32 decode node, a gateway. Before, the bfloat16 node stayed
healthy, looked the least loaded, and failed most requests with FAILED_PRECONDITION."""

from __future__ import annotations

import contextlib
import subprocess
import time

import grpc
import pytest
from pdserve.v1 import gateway_pb2_grpc

from services.cluster.local import wait_until_polled
from services.common.launch import launch
from services.common.ports import unused_port
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy, model_nodes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mixed():
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str):  # every process at once: the nodes on chosen ports
            return stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL,
                                              wait=False, port=0 if module == "services.gateway" else unused_port()))

        decode = start("services.decode_node", *ENGINE_ARGS)
        good = start("services.prefill_node", *ENGINE_ARGS)
        other = start("services.prefill_node", *ENGINE_ARGS, "--dtype", "bfloat16")
        gateway = start("services.gateway", "--prefill", f"{good.address},{other.address}", "--decode",
                        decode.address, *GATEWAY_ARGS)
        for process in (decode, good, other, gateway):
            process.wait_serving(120)
        wait_until_polled(gateway.address, 3)  # the bfloat16 node too: it answers, and is left out
        with grpc.insecure_channel(gateway.address) as channel:
            yield gateway_pb2_grpc.GatewayStub(channel), good.address, other.address, decode.address


def settled(stub, timeout_s: float = 30.0) -> dict:
    """The model nodes by address once every one has been polled."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = {n.address: n for n in model_nodes(stub)}
        if all(n.kv_layout_id or n.error for n in nodes.values()) or time.monotonic() > deadline:
            return nodes
        time.sleep(0.1)


def test_a_prefill_node_no_decode_node_can_take_kv_from_is_left_out_saying_why(mixed):
    stub, good, other, decode = mixed
    nodes = settled(stub)
    assert nodes[good].healthy and nodes[decode].healthy
    assert nodes[good].kv_layout_id == nodes[decode].kv_layout_id != nodes[other].kv_layout_id != ""
    assert not nodes[other].healthy
    assert nodes[other].error.startswith(f"its KV layout {nodes[other].kv_layout_id} matches no healthy decode "
                                         f"node's ({nodes[decode].kv_layout_id})")
    for i in range(6):  # an idle bfloat16 node would have looked the least loaded for each
        tokens, _, last = generate(stub, prompt=f"Request {i}: the sky is", sampling=greedy(3))
        assert len(tokens) == 3 and last.finish_reason == "length"
    assert {n.address: n.requests_total for n in model_nodes(stub)}[other] == 0

"""A request whose prefill node's engine fails under it (before its first token) is started over by the
gateway on the other prefill node and completes; the failed node leaves with exit code 70. Real processes:
a gateway, two prefill nodes (the first one's engine raises at the first step it runs, ``failing_node.py``)
and a decode node."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request

import grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import wait_until_polled
from services.common.launch import launch
from services.common.ports import unused_port
from services.engine_node.serve import ENGINE_FAILED_EXIT_CODE
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy

NODE_ARGS = (*ENGINE_ARGS, "--engine-failure-exit-s", "0.5")


def test_a_request_whose_prefill_engine_failed_is_retried_on_the_other_node():
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str, env: dict[str, str] | None = None, role: str = ""):
            return stack.enter_context(launch(module, *args, env=env, startup_timeout_s=90, wait=False,
                                              stderr=subprocess.DEVNULL, role=role, port=unused_port()))

        # on chosen ports: the gateway starts beside the nodes, given their addresses
        failing = start("tests.e2e.failing_node", *NODE_ARGS,
                        env={"FAILING_NODE_ROLE": "prefill", "FAILING_NODE_AT_WORK": "1"}, role="prefill")
        healthy = start("services.prefill_node", *NODE_ARGS)
        decode = start("services.decode_node", *NODE_ARGS)
        gateway = stack.enter_context(launch(
            "services.gateway", "--prefill", f"{failing.address},{healthy.address}", "--decode", decode.address,
            *GATEWAY_ARGS, startup_timeout_s=60, stderr=subprocess.DEVNULL, wait=False))
        for process in (failing, healthy, decode, gateway):
            process.wait_serving(90)
        wait_until_polled(gateway.address, 3)  # both prefill nodes healthy: the loop below reaches the failing one
        channel = stack.enter_context(grpc.insecure_channel(gateway.address))
        stub = gateway_pb2_grpc.GatewayStub(channel)

        for _ in range(8):  # until the failing node was given a request (its engine fails at its first step)
            tokens, _, last = generate(stub, timeout=60, prompt="The capital of France is", sampling=greedy(6))
            assert len(tokens) == 6 and last.finish_reason == "length"
            if failing.process.poll() is not None:
                break
        assert failing.process.wait(10) == ENGINE_FAILED_EXIT_CODE
        status = stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10)
        with urllib.request.urlopen(status.gateway_metrics_url, timeout=10) as reply:
            metrics = reply.read().decode()
        assert 'pdserve_gateway_retries_total{role="prefill"} 1.0' in metrics
        tokens, _, _ = generate(stub, timeout=60, prompt="The capital of France is", sampling=greedy(6))
        assert len(tokens) == 6  # served on without the lost node

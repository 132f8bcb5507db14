"""SIGTERM on a decode node: it stops taking work, lets its in-flight request finish, frees, exits 0."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.launch import launch
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, greedy

pytestmark = pytest.mark.slow


def test_sigterm_on_decode_node_finishes_in_flight_request_then_exits_cleanly():
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str):
            return stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL))

        decode = start("services.decode_node", *ENGINE_ARGS)
        prefill = start("services.prefill_node", *ENGINE_ARGS)
        gateway = start("services.gateway", "--prefill", prefill.address, "--decode", decode.address, *GATEWAY_ARGS)
        stub = gateway_pb2_grpc.GatewayStub(stack.enter_context(grpc.insecure_channel(gateway.address)))
        call = stub.Generate(gateway_pb2.GenerateRequest(prompt="Count slowly:", sampling=greedy(60)), timeout=120)
        tokens = list(next(call).token_ids)
        decode.process.send_signal(signal.SIGTERM)
        for response in call:
            tokens += response.token_ids
            last = response
        assert last.finish_reason == "length" and len(tokens) == 60
        assert decode.process.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the gateway notices the node is gone
            nodes = stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10).nodes
            if not next(n for n in nodes if n.role == "decode").healthy:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the drained decode node is still reported healthy")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(gateway_pb2.GenerateRequest(prompt="Hello", sampling=greedy(4)), timeout=30))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # no decode node: not a full cluster (429)


def test_a_decode_node_whose_drain_runs_out_ends_its_requests_with_a_reason_and_exits_cleanly():
    with contextlib.ExitStack() as stack:
        def start(module: str, *args: str):
            return stack.enter_context(launch(module, *args, startup_timeout_s=120, stderr=subprocess.DEVNULL))

        decode = start("services.decode_node", *ENGINE_ARGS, "--drain-timeout-s", "2", "--grace-s", "1")
        prefill = start("services.prefill_node", *ENGINE_ARGS)
        gateway = start("services.gateway", "--prefill", prefill.address, "--decode", decode.address, *GATEWAY_ARGS)
        stub = gateway_pb2_grpc.GatewayStub(stack.enter_context(grpc.insecure_channel(gateway.address)))
        call = stub.Generate(gateway_pb2.GenerateRequest(prompt="Count slowly:", sampling=greedy(4000)), timeout=120)
        next(call)
        decode.process.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as info:
            for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the decode node is draining and stopped waiting for the request after 1.5 s" in info.value.details()
        assert decode.process.wait(timeout=30) == 0

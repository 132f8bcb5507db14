"""``local.wait_until_polled``, the launcher's last wait: until the gateway's ``ClusterStatus`` has an answer from
every model node; at once when a process of the cluster exits or the gateway fails the call; past its timeout,
naming each node not heard from and why; not at all when the gateway wants a key the launcher lacks. Against a
stand-in of the gateway's ``ClusterStatus`` (what the gateway's directory reports is tested with real ones)."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import wait_until_polled
from services.common.launch import ServiceProcess
from services.common.ports import StartupError


class Status(gateway_pb2_grpc.GatewayServicer):
    def __init__(self):
        self.answers: list[list[gateway_pb2.NodeStatus]] = []  # one per call, the last repeated
        self.refuse: grpc.StatusCode | None = None

    def ClusterStatus(self, request, context):
        if self.refuse is not None:
            context.abort(self.refuse, "no")
        nodes = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return gateway_pb2.ClusterStatusResponse(nodes=nodes)


@pytest.fixture
def gateway():
    status = Status()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    gateway_pb2_grpc.add_GatewayServicer_to_server(status, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", status
    server.stop(None)


UNREACHED = gateway_pb2.NodeStatus(address="127.0.0.1:20001", role="decode", error="UNAVAILABLE: refused")
HEARD = gateway_pb2.NodeStatus(address="127.0.0.1:20001", role="decode", healthy=True, model_name="m")
LEFT_OUT = gateway_pb2.NodeStatus(address="127.0.0.1:20002", role="prefill", model_name="other",
                                  error="it serves another model")


def test_it_returns_once_every_node_answered_healthy_or_left_out(gateway):
    address, status = gateway
    status.answers = [[UNREACHED, LEFT_OUT], [UNREACHED, LEFT_OUT], [HEARD, LEFT_OUT]]
    wait_until_polled(address, 2, timeout_s=10)
    assert status.answers == [[HEARD, LEFT_OUT]]


def test_past_its_timeout_it_names_each_node_not_heard_from(gateway):
    address, status = gateway
    status.answers = [[UNREACHED]]
    with pytest.raises(StartupError, match=r"lists 1 of 2 model nodes and has not heard from 1 after 0.3s "
                                           r"\(127.0.0.1:20001: UNAVAILABLE: refused\)"):
        wait_until_polled(address, 2, timeout_s=0.3)


def test_a_process_that_exited_ends_the_wait_at_once(gateway):
    address, status = gateway
    status.answers = [[UNREACHED]]
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    node = ServiceProcess("services.decode_node", dead, address="127.0.0.1:20001")
    with pytest.raises(StartupError, match=r"services.decode_node \(127.0.0.1:20001\) exited with code 3"):
        wait_until_polled(address, 1, timeout_s=60, processes=[node])


def test_a_key_it_lacks_ends_the_wait_and_another_failure_is_a_startup_error(gateway):
    address, status = gateway
    status.refuse = grpc.StatusCode.UNAUTHENTICATED
    wait_until_polled(address, 1, timeout_s=60)
    status.refuse = grpc.StatusCode.INTERNAL
    with pytest.raises(StartupError, match="failed ClusterStatus: INTERNAL: no"):
        wait_until_polled(address, 1, timeout_s=60)

"""An engine that fails fast: a real prefill and a real decode node whose engine thread raises on purpose
(``failing_node.py``). At once: every stream attached or waiting there ends ``UNAVAILABLE`` naming the
failure, health turns ``NOT_SERVING`` (overall and per service), new calls fail ``UNAVAILABLE``; after
``--engine-failure-exit-s`` the process exits 70 (its supervisor restarts it)."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2, prefill_pb2, prefill_pb2_grpc

from services.common.launch import ServiceProcess, launch
from services.common.tls.channels import open_sync_channel
from services.engine_node.serve import ENGINE_FAILED_EXIT_CODE
from tests.e2e.failing_node import INJECTED
from tests.tls_identities import identity_of

NODE_ARGS = ("--dtype", "float32", "--threads", "1", "--num-kv-blocks", "64", "--metrics-listen", "",
             "--engine-failure-exit-s", "3")
FAILURE = f"the engine failed: RuntimeError('{INJECTED}')"
SAMPLING = {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
PROMPT = list(range(10, 40))


@contextlib.contextmanager
def failing_nodes(tmp_path: Path) -> Iterator[tuple[ServiceProcess, ServiceProcess, Path]]:
    """A failing prefill and decode node, started together (model loads overlap); both fail once the
    trigger file exists."""
    trigger = tmp_path / "fail"
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(launch("tests.e2e.failing_node", *NODE_ARGS, startup_timeout_s=90, wait=False,
                                            stderr=subprocess.DEVNULL, role=role,
                                            env={"FAILING_NODE_ROLE": role, "FAILING_NODE_TRIGGER": str(trigger)}))
                 for role in ("prefill", "decode")]
        for node in nodes:
            node.wait_serving(90)
        yield nodes[0], nodes[1], trigger


class RefusingDecode(decode_pb2_grpc.DecodeNodeServicer):
    """A decode node that is always full: a prefill request waits in its queue for a grant."""

    def Reserve(self, request, context):
        return decode_pb2.ReserveResponse(granted=False, reason="full", block_size=16, retry_after_ms=50)

    def Abort(self, request, context):
        return node_pb2.AbortResponse(found=False)


@contextlib.contextmanager
def refusing_decode() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    decode_pb2_grpc.add_DecodeNodeServicer_to_server(RefusingDecode(), server)
    port = server.add_secure_port("127.0.0.1:0", identity_of("decode").server_credentials())  # a decode node's
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


class Outcome:
    """A streaming call read to its end on a thread: its messages, its error and when it ended."""

    def __init__(self, call) -> None:
        self.call, self.messages, self.error, self.ended_at = call, [], None, 0.0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            self.messages.extend(self.call)
        except grpc.RpcError as error:
            self.error = error
        self.ended_at = time.monotonic()

    def wait(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the stream did not end within {timeout_s} s"


def health(channel: grpc.Channel, service: str = "") -> str:
    answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def test_a_failed_engine_ends_streams_turns_not_serving_and_exits(tmp_path):
    with failing_nodes(tmp_path) as (prefill, decode, trigger), refusing_decode() as full_decode, \
            open_sync_channel(prefill.address, "prefill") as p_channel, \
            open_sync_channel(decode.address, "decode") as d_channel:
        p_stub, d_stub = prefill_pb2_grpc.PrefillNodeStub(p_channel), decode_pb2_grpc.DecodeNodeStub(d_channel)
        for rid in ("attached", "unattached"):
            granted = d_stub.Reserve(decode_pb2.ReserveRequest(request_id=rid, prompt_token_ids=PROMPT, max_tokens=8,
                                                               sampling=SAMPLING), timeout=10)
            assert granted.granted, granted.reason
        attached = Outcome(d_stub.Attach(decode_pb2.AttachRequest(request_id="attached"), timeout=60))
        waiting = Outcome(p_stub.Prefill(prefill_pb2.PrefillRequest(
            request_id="waiting", prompt_token_ids=PROMPT, sampling=SAMPLING, decode_candidates=[full_decode]),
            timeout=60))
        time.sleep(0.5)  # both streams are open and waiting
        assert attached.ended_at == 0 and waiting.ended_at == 0
        assert health(p_channel) == health(d_channel) == "SERVING"

        trigger.touch()
        failed_at = time.monotonic()
        for outcome in (attached, waiting):
            outcome.wait(10)
            assert outcome.error is not None, f"the stream ended without an error: {outcome.messages}"
            assert outcome.error.code() == grpc.StatusCode.UNAVAILABLE
            assert FAILURE in outcome.error.details()
            assert outcome.ended_at - failed_at < 2.5  # at once, not at the stream's deadline or the exit
        assert "waiting" in waiting.error.details()  # the prefill call names its request

        for channel, service in ((p_channel, "pdserve.v1.PrefillNode"), (d_channel, "pdserve.v1.DecodeNode")):
            assert health(channel) == "NOT_SERVING"
            assert health(channel, service) == "NOT_SERVING"
        with pytest.raises(grpc.RpcError) as late:  # a stream that was waiting for its Attach
            list(d_stub.Attach(decode_pb2.AttachRequest(request_id="unattached"), timeout=10))
        assert late.value.code() == grpc.StatusCode.UNAVAILABLE and FAILURE in late.value.details()
        with pytest.raises(grpc.RpcError) as status:  # the gateway counts the node unhealthy
            d_stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=10)
        assert status.value.code() == grpc.StatusCode.UNAVAILABLE and INJECTED in status.value.details()

        for node in (prefill, decode):
            assert node.process.wait(20) == ENGINE_FAILED_EXIT_CODE, node.module
        assert time.monotonic() - failed_at > 2.5  # after the drain (--engine-failure-exit-s 3), not at once

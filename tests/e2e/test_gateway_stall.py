"""A gateway that stands still (SIGSTOP, as a long GC pause would) under a load of streams loses its calls to
the decode node — the node's keepalive gives up on it — and, once it runs again, attaches again and resumes
each stream after the tokens it had (``resume_after``): every stream completes with the greedy tokens of an
undisturbed run, and afterwards the cluster is idle. Before, the streams failed "lost the call to decode
node … while this gateway stood still". Real processes, the bundled model, keepalive 1 s / 1 s everywhere
so that a 5 s stop breaks the calls."""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, greedy, wait_idle
from tests.engine.prompts import STORY

pytestmark = pytest.mark.slow

STREAMS = 12
NEW_TOKENS = 100  # ~98 steps after the stop begins: the calls must still be open when keepalive breaks them (~2 s)
STOP_S = 5.0
KEEPALIVE_ARGS = ("--keepalive-s", "1", "--keepalive-timeout-s", "1")


@pytest.fixture(scope="module")
def stalled_cluster():
    with tempfile.TemporaryDirectory(prefix="pdserve-stall-") as tmp:
        log_path = Path(tmp) / "cluster.log"
        with open(log_path, "wb") as log_file:
            spec = ClusterSpec(engine_args=(*ENGINE_ARGS, *KEEPALIVE_ARGS),
                               gateway_args=(*GATEWAY_ARGS, *KEEPALIVE_ARGS))
            with start_cluster(spec, stderr=log_file.fileno()) as running, \
                    grpc.insecure_channel(running.address) as channel:
                yield running, gateway_pb2_grpc.GatewayStub(channel), log_path


def _prompts() -> list[str]:
    words = STORY.split()
    return [f"Story {i}: " + " ".join(words[i * 5:i * 5 + 12]) for i in range(STREAMS)]


def _run_all(stub, progress: list[int] | None = None) -> list[list[int]]:
    """Every prompt's stream at once, read to the end: its token ids (``progress[i]``: tokens so far)."""

    def one(i: int, prompt: str) -> list[int]:
        tokens: list[int] = []
        for response in stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, sampling=greedy(NEW_TOKENS)),
                                      timeout=120):
            tokens += response.token_ids
            if progress is not None:
                progress[i] = len(tokens)
        return tokens

    with ThreadPoolExecutor(STREAMS) as pool:
        return list(pool.map(one, range(STREAMS), _prompts()))


def test_streams_survive_a_gateway_that_stood_still(stalled_cluster):
    cluster, stub, log_path = stalled_cluster
    undisturbed = _run_all(stub)
    assert all(len(tokens) == NEW_TOKENS for tokens in undisturbed)

    progress = [0] * STREAMS
    results: list[list[int]] = []
    runner = threading.Thread(target=lambda: results.extend(_run_all(stub, progress)))
    runner.start()
    deadline = time.monotonic() + 60
    while min(progress) < 2 and runner.is_alive() and time.monotonic() < deadline:  # every stream decoding
        time.sleep(0.005)
    gateway = cluster.gateway.process
    gateway.send_signal(signal.SIGSTOP)
    try:
        time.sleep(STOP_S)
    finally:
        gateway.send_signal(signal.SIGCONT)
    runner.join(120)
    assert not runner.is_alive()
    assert results == undisturbed  # every stream complete: no gap, no duplicate, the same greedy tokens
    wait_idle(stub)  # nothing running, reserved or attached on any node: nothing leaked
    log = log_path.read_text(errors="replace")
    assert "re-attaching to the decode node" in log  # the stop did break the calls, and they were resumed
    assert "lost the call" not in log

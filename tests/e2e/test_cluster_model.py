"""``python -m services.cluster --model DIR`` (what ``make run MODEL=DIR`` runs) serves a model directory end
to end: the CLI as a process, a tiny random-weight Llama HF directory, ``--served-model-name`` and
``--max-model-len`` reaching the gateway and the nodes. Then a prefill node started with other weights
beside it is left out by a gateway of the first model, saying why, and never given a request."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.launch import REPO_ROOT, launch
from services.engine.random_llama import PRESETS, write_random_llama_dir
from services.engine.weights.digest import weights_digest
from services.gateway.model_check import MISMATCH
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, generate, greedy, model_nodes

pytestmark = pytest.mark.slow

SERVED = "tiny-test"
MAX_MODEL_LEN = 256
PROMPT = "t5 t17 t300 t42 t7"  # the random model's word-level tokenizer: tokens t0 .. t511


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return (write_random_llama_dir(root / "ours", PRESETS["tiny"], seed=0),
            write_random_llama_dir(root / "theirs", PRESETS["tiny"], seed=1))


def read_until_up(process: subprocess.Popen[str], timeout_s: float) -> dict[str, str]:
    """The CLI's banner as ``{label: value}`` once it printed ``Ctrl-C stops everything``."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    banner, deadline = {}, time.monotonic() + timeout_s
    while True:
        line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
        assert line is not None, f"the CLI exited ({process.poll()}) before it was up: {banner}"
        if match := re.match(r"pdserve is up: (gateway) (\S+)|\s+(model|prefill|decode|cache-store):\s+(\S.*)", line):
            label, value = (match[1], match[2]) if match[1] else (match[3], match[4])
            banner[label] = value.strip()
        if "Ctrl-C stops everything" in line:
            return banner


@pytest.fixture(scope="module")
def cli(models):
    ours, _ = models
    command = [sys.executable, "-m", "services.cluster", "--model", str(ours), "--served-model-name", SERVED,
               "--max-model-len", str(MAX_MODEL_LEN), "--gateway", "127.0.0.1:0", "--http", "127.0.0.1:0",
               "--dtype", "float32", "--threads", "1"]
    env = {**os.environ, "PDSERVE_NUM_KV_BLOCKS": "256", "PDSERVE_LOG_LEVEL": "warning"}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, start_new_session=True)
    try:
        yield read_until_up(process, timeout_s=180)
    finally:
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C, to the whole group: the CLI stops them all
        try:
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stub(cli):
    with grpc.insecure_channel(cli["gateway"]) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


def test_the_cli_serves_the_model_directory_under_its_served_name(cli, stub, models):
    ours, _ = models
    digest = weights_digest(ours)
    assert cli["model"] == f"{SERVED} (random-tiny, weights {digest[:12]})"
    tokens, text, last = generate(stub, prompt=PROMPT, sampling=greedy(8))
    assert len(tokens) == 8 and all(0 <= t < PRESETS["tiny"].vocab_size for t in tokens)
    assert last.finish_reason == "length" and re.fullmatch(r"( ?t\d+)+", text)
    status = stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10)
    assert (status.served_model_name, status.model_name, status.weights_digest) == (SERVED, "random-tiny", digest)
    nodes = model_nodes(stub)
    assert len(nodes) == 2 and all(n.healthy and n.weights_digest == digest for n in nodes)
    with urllib.request.urlopen(f"{status.http_url}/v1/models", timeout=10) as reply:
        assert [m["id"] for m in json.load(reply)["data"]] == [SERVED]


def test_max_model_len_reaches_the_gateway(stub):
    with pytest.raises(grpc.RpcError) as refused:
        generate(stub, token_ids=list(range(MAX_MODEL_LEN)), sampling=greedy(1))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_node_serving_other_weights_is_left_out_saying_why(cli, stub, models):
    ours, theirs = models
    with contextlib.ExitStack() as stack:
        other = stack.enter_context(launch("services.prefill_node", *ENGINE_ARGS, "--model", str(theirs),
                                           startup_timeout_s=120, stderr=subprocess.DEVNULL))
        good = cli["prefill"]
        gateway = stack.enter_context(launch(
            "services.gateway", "--model", str(ours), "--prefill", f"{good},{other.address}",
            "--decode", cli["decode"], *GATEWAY_ARGS, startup_timeout_s=60, stderr=subprocess.DEVNULL))
        with grpc.insecure_channel(gateway.address) as channel:
            second = gateway_pb2_grpc.GatewayStub(channel)
            deadline = time.monotonic() + 30
            while not (left := {n.address: n for n in model_nodes(second)}[other.address]).error:
                assert time.monotonic() < deadline, "the other node was never polled"
                time.sleep(0.1)
            assert not left.healthy and left.weights_digest == weights_digest(theirs)
            assert left.error == (f"{MISMATCH}: random-tiny (weights {weights_digest(theirs)[:12]}), the gateway "
                                  f"tokenizes for random-tiny (weights {weights_digest(ours)[:12]}); start both "
                                  f"with the same --model")
            for i in range(4):  # idle, the other node would look the least loaded
                tokens, _, last = generate(second, prompt=f"t{i} t9 t10", sampling=greedy(2))
                assert len(tokens) == 2 and last.finish_reason == "length"
            assert {n.address: n.requests_total for n in model_nodes(second)}[other.address] == 0

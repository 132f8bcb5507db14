"""``python -m services.bench`` as a user runs it, against a live cluster (real processes, the real model):
pdserve's gRPC gateway and its OpenAI HTTP front in one invocation, the same prompts to both."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import grpc
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.common.launch import REPO_ROOT
from services.gateway.config import GatewayConfig
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS

pytestmark = pytest.mark.slow

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 8, 48, 12
HAS_HTTP_FRONT = "http_listen" in {f.name for f in fields(GatewayConfig)}


@pytest.fixture(scope="module")
def targets() -> list[str]:
    http_args = ("--http-listen", "127.0.0.1:0") if HAS_HTTP_FRONT else ()
    spec = ClusterSpec(cache_store=False, engine_args=ENGINE_ARGS, gateway_args=(*GATEWAY_ARGS, *http_args))
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster:
        found = [f"pdserve-grpc=grpc://{cluster.address}"]
        if HAS_HTTP_FRONT:
            with grpc.insecure_channel(cluster.address) as channel:
                status = gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(),
                                                                             timeout=10)
            assert status.http_url.startswith("http://127.0.0.1:")
            found.append(f"pdserve-http={status.http_url}")
        yield found


def test_bench_serve_against_a_live_cluster(targets, tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    command = [sys.executable, "-m", "services.bench", *(a for t in targets for a in ("--target", t)),
               "--dataset-name", "random", "--num-prompts", str(NUM_PROMPTS), "--input-len", str(INPUT_LEN),
               "--output-len", str(OUTPUT_LEN), "--max-concurrency", "4", "--warmup", "1",
               "--goodput", "ttft:60000", "--json", str(out_json), "--plot", str(out_png), "--no-progress"]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Output token throughput (tok/s)" in result.stdout
    report = json.loads(out_json.read_text())
    assert list(report["targets"]) == [t.split("=")[0] for t in targets]
    prompt_lens = []
    for name, target in report["targets"].items():
        median = target["median"]
        assert median["completed"] == NUM_PROMPTS and median["failed"] == 0, name
        assert median["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN, name  # ignore_eos: exact lengths
        assert median["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN, name  # as the server counted them
        assert median["ttft_ms"]["median"] > 0 and median["tpot_ms"]["median"] > 0, name
        assert median["e2el_ms"]["p99"] >= median["ttft_ms"]["p99"], name
        assert median["goodput"] == pytest.approx(median["request_throughput"]), name  # a 60 s TTFT SLO: all meet it
        assert median["output_throughput"] > 0 and median["peak_concurrency"] == 4, name
        requests = target["requests"][0]
        assert all(r["ok"] and r["output_tokens"] == OUTPUT_LEN for r in requests), name
        prompt_lens.append([r["prompt_len"] for r in requests])
    assert all(lens == prompt_lens[0] for lens in prompt_lens)  # the same prompts, token for token
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

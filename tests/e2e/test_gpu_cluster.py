"""The cluster on a GPU: gateway, prefill node and decode node as processes with the model and the KV pool
on CUDA, the prompt's KV moved by CUDA IPC (one host, one GPU).

- float32 (attention by the torch backend): greedy outputs equal the CPU float32 mixed engine's, token for
  token, for prompts from 1 to 700 tokens, 8 at once; the prefill node's log shows the IPC link ready.
- bfloat16 (attention by FlashInfer when it imports): one request at a time, outputs equal the same GPU's
  mixed engine with the same backend (same kernels, same batch shapes, KV copied bit for bit); the same with
  ``--cuda-graphs on`` on both (decode steps replayed from CUDA graphs, issue 29).

The model is the bundled one where it is installed, else random weights of its shape (the GPU machine
cannot carry the GGUF). Skipped where CUDA is absent (``gpu`` marker)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import torch
from pdserve.v1 import gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import ModelLoadError
from services.engine.sampling_params import SamplingParams
from tests.e2e.conftest import GATEWAY_ARGS, generate, greedy, wait_idle

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
NEW_TOKENS = 16
ENGINE = ("--device", "cuda", "--num-kv-blocks", "1024", "--max-num-batched-tokens", "256", "--kv-ipc", "auto")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from services.engine.model_files import bundled_model_path
    from services.engine.random_llama import PRESETS, write_random_llama_dir

    try:
        return str(bundled_model_path())
    except ModelLoadError:
        return str(write_random_llama_dir(tmp_path_factory.mktemp("model"), PRESETS["smollm2-135m"], seed=7))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    lengths = [1, 5, 16, 17, 100, 255, 300, 700]
    return [torch.randint(10, 40000, (n,), generator=gen).tolist() for n in lengths]


def engine_outputs(model_path: str, prompts: list[list[int]], device: str, dtype: str, one_by_one: bool,
                   cuda_graphs: bool = False) -> list:
    engine = LLMEngine.from_config(EngineConfig(model_path=model_path, dtype=dtype, device=device,
                                                num_kv_blocks=1024, max_num_batched_tokens=256,
                                                cuda_graphs=cuda_graphs))
    assert (engine.runner.graphs is not None) == cuda_graphs
    if device == "cuda" and dtype == "bfloat16":
        assert engine.runner.attention.name == "flashinfer"
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    if one_by_one:
        return [engine.generate([p], params)[0].token_ids for p in prompts]
    return [r.token_ids for r in engine.generate(prompts, params)]


def run_cluster(model_path: str, dtype: str, prompts: list[list[int]], log: Path, concurrent: bool,
                extra: tuple[str, ...] = ()) -> list:
    spec = ClusterSpec(engine_args=("--model", model_path, "--dtype", dtype, *ENGINE, *extra),
                       gateway_args=(*GATEWAY_ARGS, "--model", model_path),  # its tokenizer: no bundled one there
                       cache_store=False, startup_timeout_s=300)
    with log.open("w") as stderr, start_cluster(spec, stderr=stderr.fileno()) as cluster, \
            grpc.insecure_channel(cluster.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        def run(ids: list[int]) -> list[int]:
            tokens, _, last = generate(stub, token_ids=ids, sampling=greedy(NEW_TOKENS))
            assert last.finish_reason == "length"
            return tokens

        if concurrent:
            with ThreadPoolExecutor(len(prompts)) as pool:
                results = list(pool.map(run, prompts))
        else:
            results = [run(ids) for ids in prompts]
        wait_idle(stub)
    return results


def ipc_links_ready(log: Path) -> int:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    fallbacks = [line for line in lines if line.get("event", "").startswith("kv ipc off")]
    assert not fallbacks, fallbacks
    return sum(line.get("event") == "kv ipc ready" for line in lines)


def test_float32_on_the_gpu_matches_the_cpu_reference_with_kv_by_ipc(model_path, prompts, tmp_path) -> None:
    expected = engine_outputs(model_path, prompts, "cpu", "float32", one_by_one=False)
    log = tmp_path / "cluster.log"
    assert run_cluster(model_path, "float32", prompts, log, concurrent=True) == expected
    assert ipc_links_ready(log) == 1


def test_bfloat16_flashinfer_cluster_matches_the_gpu_mixed_engine(model_path, prompts, tmp_path) -> None:
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed (the 'gpu' extra)")
    expected = engine_outputs(model_path, prompts, "cuda", "bfloat16", one_by_one=True)
    log = tmp_path / "cluster.log"
    assert run_cluster(model_path, "bfloat16", prompts, log, concurrent=False) == expected
    assert ipc_links_ready(log) == 1


def test_bfloat16_cluster_with_cuda_graphs_matches_the_gpu_mixed_engine_with_them(model_path, prompts,
                                                                                   tmp_path) -> None:
    expected = engine_outputs(model_path, prompts, "cuda", "bfloat16", one_by_one=True, cuda_graphs=True)
    log = tmp_path / "cluster.log"
    assert run_cluster(model_path, "bfloat16", prompts, log, concurrent=False, extra=("--cuda-graphs", "on")) \
        == expected
    assert ipc_links_ready(log) == 1
    events = [json.loads(line).get("event", "") for line in log.read_text().splitlines() if line.startswith("{")]
    assert sum(e.startswith("cuda graphs: decode captured") for e in events) == 1  # the decode node's: a
    # prefill node runs no decode-only step and captures nothing

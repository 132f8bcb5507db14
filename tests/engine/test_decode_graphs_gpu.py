"""Decode graphs on a real GPU (issue 29): graphs captured per bucket replay the tokens the eager engine
gives, greedy, float32 (torch graph attention) and bf16 (FlashInfer's CUDA-graph decode where it imports),
for every bucket a batch of 1 to 16 falls in, padded ones included. Skipped where CUDA is absent (``gpu``)."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.random_llama import PRESETS, random_model
from services.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
NEW_TOKENS = 12
GROUPS = [1, 2, 3, 5, 8, 11, 16]  # buckets 1, 2, 4 (padded), 8 (padded), 8, 16 (padded), 16


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def dtype(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(dtype):
    return random_model(PRESETS["smollm2-135m"], getattr(torch, dtype), "cuda", seed=7)


def engine(model, dtype: str, graphs: bool) -> LLMEngine:
    config = EngineConfig(model_path="<random>", dtype=dtype, device="cuda", num_kv_blocks=2048,
                          max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1024, cuda_graphs=graphs)
    return LLMEngine(config, model, None)


def test_graph_replay_gives_the_eager_tokens_in_every_bucket(model, dtype):
    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    eager, graphed = engine(model, dtype, False), engine(model, dtype, True)
    graphs = graphed.runner.graphs
    assert graphs is not None and graphs.buckets == (1, 2, 4, 8, 16) and len(graphs.replays) == 5
    if dtype == "bfloat16" and eager.runner.attention.name == "flashinfer":
        assert graphs.attention.name == "flashinfer"
    for size in GROUPS:
        prompts = [torch.randint(10, 40000, (int(n),), generator=gen).tolist()
                   for n in torch.randint(1, 300, (size,), generator=gen)]
        want = [r.token_ids for r in eager.generate(prompts, params)]
        before = graphed.runner.graph_steps
        assert [r.token_ids for r in graphed.generate(prompts, params)] == want, f"a batch of {size}"
        assert graphed.runner.graph_steps - before >= NEW_TOKENS - 2  # decode steps replayed a graph
    assert graphs.padded_rows > 0
    assert graphed.kv.num_free_blocks == graphed.kv.num_blocks  # nothing leaked, the sink is nobody's

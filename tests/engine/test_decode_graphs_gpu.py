"""Decode graphs on a real GPU (issue 29), for every bucket a batch of 1 to 16 falls in, padded ones included:

- float32 (torch graph attention): a graphed engine generates the eager engine's greedy tokens exactly;
- bf16 (FlashInfer's CUDA-graph decode where it imports): on the same KV, each replayed step's logits equal
  the eager forward's within bf16 rounding. Tokens are not compared: in CUDA-graph mode FlashInfer always
  splits the KV work and a padded bucket runs its GEMMs at another row count, so the last bits differ and a
  random model's greedy tokens may part at a near-tie.

Skipped where CUDA is absent (``gpu`` marker)."""

from __future__ import annotations

import pytest
import torch

from kernels.attention.metadata import AttentionMetadata
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.random_llama import PRESETS, random_model
from services.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
NEW_TOKENS = 12
GROUPS = [1, 2, 3, 5, 8, 11, 16]  # buckets 1, 2, 4 (padded), 8 (padded), 8, 16 (padded), 16


def engine(model, dtype: str, graphs: bool) -> LLMEngine:
    config = EngineConfig(model_path="<random>", dtype=dtype, device="cuda", num_kv_blocks=2048,
                          max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1024, cuda_graphs=graphs)
    return LLMEngine(config, model, None)


def test_float32_graph_replay_generates_the_eager_tokens_in_every_bucket():
    model = random_model(PRESETS["smollm2-135m"], torch.float32, "cuda", seed=7)
    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    eager, graphed = engine(model, "float32", False), engine(model, "float32", True)
    graphs = graphed.runner.graphs
    assert graphs is not None and graphs.buckets == (1, 2, 4, 8, 16) and len(graphs.replays) == 5
    assert graphs.attention.name == "torch"
    for size in GROUPS:
        prompts = [torch.randint(10, 40000, (int(n),), generator=gen).tolist()
                   for n in torch.randint(1, 300, (size,), generator=gen)]
        want = [r.token_ids for r in eager.generate(prompts, params)]
        before = graphed.runner.graph_steps
        assert [r.token_ids for r in graphed.generate(prompts, params)] == want, f"a batch of {size}"
        assert graphed.runner.graph_steps - before >= NEW_TOKENS - 2  # decode steps replayed a graph
    assert graphs.padded_rows > 0
    assert graphed.kv.num_free_blocks == graphed.kv.num_blocks  # nothing leaked, the sink is nobody's


def test_bf16_graph_replay_gives_the_eager_logits_in_every_bucket():
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed (the 'gpu' extra)")
    model = random_model(PRESETS["smollm2-135m"], torch.bfloat16, "cuda", seed=7)
    eager, graphed = engine(model, "bfloat16", False), engine(model, "bfloat16", True)
    graphs = graphed.runner.graphs
    assert graphs is not None and graphs.attention.name == "flashinfer"
    assert eager.runner.attention.name == "flashinfer"
    gen = torch.Generator(device="cuda").manual_seed(5)
    pool = torch.randn(eager.runner.kv_cache.shape, generator=gen, device="cuda").to(torch.bfloat16)
    cpu = torch.Generator().manual_seed(6)
    for rows in GROUPS:
        for runner in (eager.runner, graphed.runner):  # the same context in both pools (the sink aside)
            runner.kv_cache[:, :pool.shape[1]].copy_(pool)
        seq_lens = torch.randint(1, 500, (rows,), generator=cpu).tolist()
        blocks = torch.randperm(2048, generator=cpu).tolist()
        tables, used = [], 0
        for s in seq_lens:
            tables.append(blocks[used:used + -(-s // 16)])
            used += len(tables[-1])
        ids = torch.randint(10, 40000, (rows,), generator=cpu).tolist()
        positions = [s - 1 for s in seq_lens]
        got = graphs.run(ids, positions, seq_lens, tables).clone()
        eager.runner.attention.plan(AttentionMetadata.build([1] * rows, seq_lens, tables, 16, "cuda"))
        with torch.inference_mode():
            want = model.forward(torch.tensor(ids, device="cuda"), torch.tensor(positions, device="cuda"),
                                 eager.runner.kv_layers, eager.runner.attention, torch.arange(rows, device="cuda"))
        assert got.shape == want.shape
        scale = want.abs().max()
        assert (got - want).abs().max() < 0.02 * scale, f"{rows} rows: {(got - want).abs().max() / scale:.4f}"
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75

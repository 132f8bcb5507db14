"""Grouped experts on a real GPU (issue 29): ``grouped_mm`` passes its load check in bf16, a sparse layer
gives the per-expert loop's numbers within bf16 rounding, and a MoE model's decode is captured in CUDA
graphs and replays the eager logits, padded buckets included. Skipped where CUDA is absent (``gpu`` marker)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from services.engine.decode_graphs import CudaGraphCapture, GraphOptions
from services.engine.model.decoder import DecoderModel
from services.engine.model.moe import moe_forward
from services.engine.model.moe_grouped import grouped_experts_problem
from services.engine.model_runner import ModelRunner
from tests.engine.graph_replay import replays_beside_eager
from tests.engine.test_fused_ops_model import BLOCK, CONFIGS, tensors
from tests.engine.test_moe_grouped import MOE, _layer

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def test_grouped_mm_passes_its_load_check_in_bf16() -> None:
    assert grouped_experts_problem(CUDA, torch.bfloat16) == ""


@pytest.mark.parametrize("tokens", [1, 3, 64, 300])
def test_a_grouped_layer_gives_the_loops_numbers(tokens: int) -> None:
    looped, grouped = _layer(torch.bfloat16)
    for weights in (looped, grouped):
        weights.router = replace(weights.router, weight=weights.router.weight.to(CUDA))
    looped.gate_up = [replace(w, weight=w.weight.to(CUDA)) for w in looped.gate_up]
    looped.down = [replace(w, weight=w.weight.to(CUDA)) for w in looped.down]
    grouped.grouped = replace(grouped.grouped, gate_up=grouped.grouped.gate_up.to(CUDA),
                              down=grouped.grouped.down.to(CUDA))
    x = torch.randn(tokens, looped.router.weight.shape[1], generator=torch.Generator().manual_seed(1))
    x = x.to(CUDA, torch.bfloat16)
    want = moe_forward(x, looped, MOE)
    got = moe_forward(x, grouped, MOE)
    assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()


def test_a_moe_models_decode_is_captured_and_replays_the_eager_logits() -> None:
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed (the 'gpu' extra)")
    config = replace(CONFIGS["moe"], num_heads=2, num_kv_heads=1, head_dim=64,
                     moe=replace(CONFIGS["moe"].moe, sparse_layers=(0, 1)))
    weights = tensors(config)
    grouped = DecoderModel(config, weights, torch.bfloat16, CUDA)
    assert grouped.grouped_experts
    looped = DecoderModel(config, weights, torch.bfloat16, CUDA, grouped_experts=False)
    options = GraphOptions(max_num_seqs=4, max_model_len=64, capture=CudaGraphCapture(CUDA))
    graphed = ModelRunner(grouped, 32, BLOCK, "flashinfer", graphs=options)
    eager = ModelRunner(looped, 32, BLOCK, "flashinfer")
    assert graphed.graphs is not None
    for rows, got, want in replays_beside_eager(graphed, eager, looped, (1, 3, 4), BLOCK):
        assert (got - want).abs().max() < 0.05 * want.abs().max(), rows

"""Grouped experts (``moe_grouped``, the GPU path of a sparse layer): the per-expert loop's numbers with no
host read, on this CPU bit for bit (float32 and bf16, a layer and a whole model); a MoE model with them can be
captured by the decode graphs and replays the eager logits; the load check names what fails; only CUDA models
take them by default."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from kernels.linear import prepare_linear
from services.engine.decode_graphs import GraphOptions, eager_capture, graph_support
from services.engine.model import decoder
from services.engine.model.config import MoEConfig
from services.engine.model.moe import MoEWeights, moe_forward
from services.engine.model.moe_grouped import GroupedExperts, grouped_experts_problem
from services.engine.model_runner import ModelRunner
from tests.engine.graph_replay import replays_beside_eager
from tests.engine.test_fused_ops_model import BLOCK, CONFIGS, model, prefill_then_decode

MOE = MoEConfig(num_experts=8, top_k=3, intermediate_size=24, norm_topk_prob=True, sparse_layers=(0,))
HIDDEN = 32


def _layer(dtype: torch.dtype, seed: int = 0) -> tuple[MoEWeights, MoEWeights]:
    """One sparse layer's weights as the loop holds them (plain, unpacked products) and stacked."""
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(MOE.num_experts, 2 * MOE.intermediate_size, HIDDEN, generator=gen) / 5).to(dtype)
    down = (torch.randn(MOE.num_experts, HIDDEN, MOE.intermediate_size, generator=gen) / 5).to(dtype)
    router = prepare_linear((torch.randn(MOE.num_experts, HIDDEN, generator=gen)).to(dtype), pack=False)
    looped = MoEWeights(router, [prepare_linear(w, pack=False) for w in gate_up],
                        [prepare_linear(w, pack=False) for w in down])
    return looped, MoEWeights(router, [], [], grouped=GroupedExperts(gate_up, down))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 2, 7, 40])
def test_a_grouped_layer_gives_the_loops_bits(dtype: torch.dtype, tokens: int) -> None:
    looped, grouped = _layer(dtype)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    want = moe_forward(x, looped, MOE)
    assert torch.equal(moe_forward(x, grouped, MOE), want)
    assert want.abs().max() > 0


# Nemotron 3's: ungated squared-ReLU experts, sigmoid routing with a correction bias, scaled, summed in float32
NEMOTRON = MoEConfig(num_experts=8, top_k=4, intermediate_size=24, norm_topk_prob=True, sparse_layers=(0,),
                     sigmoid_routing=True, routed_scaling=2.5, gated_experts=False, float32_expert_sum=True)


def _relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x).square()


@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_ungated_experts_summed_in_float32_agree_on_both_paths(tokens: int) -> None:
    """In bf16 the loop and the grouped GEMMs give the same bits: each expert's output times its float32 weight,
    summed in float32 and rounded once (as transformers sums Nemotron 3's), which is not the per-expert rounding."""
    gen = torch.Generator().manual_seed(tokens)
    up = (torch.randn(8, 24, HIDDEN, generator=gen) / 5).bfloat16()
    down = (torch.randn(8, HIDDEN, 24, generator=gen) / 5).bfloat16()
    router = prepare_linear(torch.randn(8, HIDDEN, generator=gen), pack=False)
    bias = torch.randn(8, generator=gen) / 10
    looped = MoEWeights(router, [prepare_linear(w, pack=False) for w in up], [prepare_linear(w, pack=False)
                                                                              for w in down], choice_bias=bias)
    grouped = MoEWeights(router, [], [], grouped=GroupedExperts(up, down), choice_bias=bias)
    x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16()
    want = moe_forward(x, looped, NEMOTRON, _relu_squared)
    assert torch.equal(moe_forward(x, grouped, NEMOTRON, _relu_squared), want)
    from services.engine.model.moe import route

    probs, experts = route(x, looped, NEMOTRON)
    by_hand = torch.zeros(tokens, HIDDEN)
    for t in range(tokens):
        for k in sorted(range(NEMOTRON.top_k), key=lambda k: int(experts[t, k])):
            e = int(experts[t, k])
            by_hand[t] += F.linear(_relu_squared(F.linear(x[t:t + 1], up[e])), down[e])[0].float() * probs[t, k]
    assert torch.equal(want, by_hand.bfloat16())
    if tokens == 40:  # rounded at each expert, the sum differs
        rounded = replace(NEMOTRON, float32_expert_sum=False)
        assert not torch.equal(moe_forward(x, looped, rounded, _relu_squared), want)


def test_the_grouped_path_reads_nothing_back_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a CUDA graph cannot hold: no ``tolist``/``item``/``bincount`` (each a device sync on a GPU)."""
    looped, grouped = _layer(torch.float32)
    x = torch.randn(5, HIDDEN)

    def host_read(*args, **kwargs):
        raise AssertionError("a host read in the grouped path")

    for name in ("tolist", "item"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    monkeypatch.setattr(torch, "bincount", host_read)
    moe_forward(x, grouped, MOE)
    with pytest.raises(AssertionError, match="host read"):
        moe_forward(x, looped, MOE)  # the loop does read its counts back


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_grouped_moe_model_gives_the_looped_models_logits(dtype: torch.dtype) -> None:
    config = CONFIGS["moe"]
    grouped, looped = (model(config, dtype, grouped_experts=on, fused_ops=False) for on in (True, False))
    assert grouped.grouped_experts and not looped.grouped_experts
    sparse = grouped.layers[config.moe.sparse_layers[0]].moe
    assert sparse.grouped is not None and sparse.gate_up == [] and sparse.down == []
    for got, want in zip(prefill_then_decode(grouped, [3, 1, 4, 1, 5, 9], 2),
                         prefill_then_decode(looped, [3, 1, 4, 1, 5, 9], 2), strict=True):
        if dtype == torch.float32:
            assert torch.equal(got, want)
        else:  # the loop's bf16 weights are oneDNN-packed on this CPU: another kernel, the last bits
            assert (got - want).abs().max() < 0.02 * want.abs().max()


def test_a_grouped_moe_model_is_captured_and_replays_the_eager_logits() -> None:
    config = replace(CONFIGS["moe"], moe=replace(CONFIGS["moe"].moe, sparse_layers=(0, 1)))
    grouped, looped = model(config, torch.float32, grouped_experts=True), model(config, torch.float32)
    assert graph_support(grouped) == "" and "mixture-of-experts" in graph_support(looped)
    options = GraphOptions(max_num_seqs=4, max_model_len=64, capture=eager_capture)
    graphed, eager = ModelRunner(grouped, 32, BLOCK, "torch", graphs=options), ModelRunner(looped, 32, BLOCK, "torch")
    # buckets 1, 4 (padded: the padding rows are routed too, and dropped), 4
    for _, got, want in replays_beside_eager(graphed, eager, looped, (1, 3, 4), BLOCK):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_load_check_passes_here_and_names_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    grouped_experts_problem.cache_clear()
    assert grouped_experts_problem(cpu, torch.bfloat16) == ""

    def unsupported(*args, **kwargs):
        raise RuntimeError("grouped gemm is only supported on SM90\nmore")

    monkeypatch.setattr(F, "grouped_mm", unsupported)
    grouped_experts_problem.cache_clear()
    assert grouped_experts_problem(cpu, torch.float32) == "grouped_mm failed: grouped gemm is only supported on SM90"
    monkeypatch.setattr(F, "grouped_mm", lambda a, b, offs: torch.zeros(a.shape[0], b.shape[-1], dtype=a.dtype))
    grouped_experts_problem.cache_clear()
    assert "disagrees with the per-expert products" in grouped_experts_problem(cpu, torch.float32)
    grouped_experts_problem.cache_clear()


def test_only_cuda_models_outside_the_deterministic_mode_take_them_by_default(monkeypatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decoder._grouped_experts(None, cpu, torch.bfloat16, False) is False
    assert decoder._grouped_experts(None, cuda, torch.bfloat16, True) is False
    assert decoder._grouped_experts(True, cpu, torch.float32, False) is True
    monkeypatch.setattr(decoder, "grouped_experts_problem", lambda device, dtype: "grouped_mm failed: no")
    assert decoder._grouped_experts(None, cuda, torch.bfloat16, False) is False
    monkeypatch.setattr(decoder, "grouped_experts_problem", lambda device, dtype: "")
    assert decoder._grouped_experts(None, cuda, torch.bfloat16, False) is True
    assert model(CONFIGS["llama"], torch.float32, grouped_experts=True).grouped_experts is False  # no experts


def _small_moe_preset():
    from services.engine.random_llama import PRESETS

    big = PRESETS["qwen3-30b-a3b-12l"]
    return replace(big, vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                   num_kv_heads=1, head_dim=16, moe=replace(big.moe, num_experts=8, top_k=2, intermediate_size=16,
                                                            sparse_layers=(0, 1)))


def test_a_random_moe_in_the_stacked_layout_loads_both_ways_and_agrees() -> None:
    """random_tensors writes transformers 5's stacked experts, which both the loop and the grouped path load."""
    from services.engine.random_llama import random_model

    config = _small_moe_preset()
    grouped, looped = (random_model(config, torch.float32, grouped_experts=on, fused_ops=False) for on in (True, False))
    assert grouped.layers[0].moe.grouped is not None and len(looped.layers[0].moe.gate_up) == 8
    for got, want in zip(prefill_then_decode(grouped, [5, 6, 7], 8), prefill_then_decode(looped, [5, 6, 7], 8),
                         strict=True):
        assert torch.equal(got, want)


def test_the_decode_floor_counts_the_experts_a_batch_picks() -> None:
    from services.engine.random_llama import attention_weights, weight_bytes

    config = _small_moe_preset()
    moe, hidden = config.moe, config.hidden_size
    fixed = config.vocab_size * hidden + config.num_layers * (attention_weights(config) + moe.num_experts * hidden)
    expert = 3 * hidden * moe.intermediate_size
    assert weight_bytes(config, 2, batch=1) == 2 * (fixed + config.num_layers * moe.top_k * expert)
    assert weight_bytes(config, 2, batch=10_000) == 2 * (fixed + config.num_layers * moe.num_experts * expert)
    assert weight_bytes(config, 2, batch=1) < weight_bytes(config, 2, batch=4) < weight_bytes(config, 2, batch=64)

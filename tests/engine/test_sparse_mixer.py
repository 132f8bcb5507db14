"""Phi-3.5-MoE's sparsemixer router (``MoEConfig.sparse_mixer_eps``) against transformers' own function, as
inference runs it, on logits with near ties (where its threshold decides) and without, in float32 and bfloat16; the
LM head's bias is read (Phi-3.5-MoE's). The family test serves the whole model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.moe import sparse_mixer_route


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_mixer_routes_as_transformers(dtype):
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    torch.manual_seed(0)
    logits = torch.randn(256, 16).to(dtype)
    logits[:64, 3] = logits[:64].max(dim=-1).values * 0.995  # near the best: within the threshold or not
    for eps in (0.01, 0.1):
        expected_weights, expected_experts = sparsemixer(logits, jitter_eps=eps, training=False, top_k=2)
        weights, experts = sparse_mixer_route(logits, eps)
        assert torch.equal(experts, expected_experts)
        assert torch.equal(weights, expected_weights.float())


def test_a_sparse_mixer_routes_two_experts_only(family_dir):
    from services.engine.weights import load_weights

    moe = load_weights(family_dir("phimoe")).config.moe
    assert moe.sparse_mixer_eps == 0.01 and not moe.norm_topk_prob
    with pytest.raises(ModelLoadError, match="the sparsemixer router picks 2 experts, not num_experts_per_tok 3"):
        dataclasses.replace(moe, top_k=3)


def test_phimoe_logits_are_transformers_and_its_head_bias_makes_them_so(family_dir):
    from tests.engine.test_model_families import _prompts
    from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe

    weights, expected, logits = exactness_probe(family_dir("phimoe"), _prompts()["long"])
    without_bias = {name: torch.zeros_like(t) if name == "lm_head.bias" else t for name, t in weights.tensors.items()}
    assert_each_part_matters(logits, expected, {"the LM head's bias": {"tensors": without_bias}})

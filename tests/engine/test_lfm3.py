"""LFM3 beyond the family test's greedy parity (tests/engine/test_model_families.py): ``Lfm3Config``'s defaults (its
documented checkpoint, LFM3-1.7B) read into LFM2's convolutions between full and sliding attention layers; the tiny
checkpoint's logits are transformers' and each of its parts (the sliding layers' own rope, their window, the gate per
head, the sandwich norms) is what makes them so; the released names; refusals by name; the bandwidth floor counts the
gates."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.lfm2 import lfm2_tensor_name
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe

LFM3 = {"architectures": ["Lfm3ForCausalLM"], "model_type": "lfm3"}  # the rest: Lfm3Config's defaults


def test_the_documented_shape_reads_convolutions_between_full_and_sliding_layers():
    cfg = config_from_hf(LFM3)
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("lfm2", 24, 16, 4, 128)
    # full attention on layers 2, 6, …, 22, sliding on 4, 8, …, 20, convolutions on the rest
    assert cfg.kv_layers == tuple(range(2, 24, 2)) and cfg.short_conv.layers == (0, *range(1, 24, 2))
    assert cfg.local_rope_layers == (4, 8, 12, 16, 20) and cfg.local_rope_theta == 10000.0
    assert {cfg.layer_windows[i] for i in cfg.local_rope_layers} == {256}
    assert all(cfg.layer_windows[i] is None for i in range(24) if i not in cfg.local_rope_layers)
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling.rope_type == "proportional"
    assert cfg.rope_scaling.rotated_fraction == 0.5
    assert cfg.sandwich_norms and cfg.attention_head_gate and cfg.qk_norm and cfg.tie_word_embeddings
    assert cfg.intermediate_size == 7680 and cfg.rms_norm_eps == 1e-5


@pytest.fixture(scope="module")
def lfm3(family_dir):
    return exactness_probe(family_dir("lfm2-lfm3"), _prompts()["long"][:64])  # past the window of 24


def test_each_part_is_what_makes_the_logits_transformers(lfm3):
    weights, expected, logits = lfm3
    cfg, tensors = weights.config, weights.tensors
    assert_each_part_matters(logits, expected, {
        "the sliding layers' own rope": dict(config=dataclasses.replace(cfg, local_rope_layers=())),
        "the window": dict(config=dataclasses.replace(cfg, layer_windows=())),
        "the gate per head": dict(tensors={**tensors, **{n: torch.zeros_like(t) for n, t in tensors.items()
                                                         if n.endswith("g_proj.weight")}}),
        "the sandwich norms": dict(tensors={**tensors, **{n: torch.ones_like(t) for n, t in tensors.items()
                                                          if n.endswith(("post_self_attn_layernorm.weight",
                                                                         "post_mlp_layernorm.weight"))}}),
    })


def test_the_released_names():
    assert lfm2_tensor_name("model.layers.2.self_attn.gate_proj.weight") == "model.layers.2.self_attn.g_proj.weight"
    assert lfm2_tensor_name("model.layers.0.post_operator_norm.weight") == \
        "model.layers.0.post_self_attn_layernorm.weight"
    assert lfm2_tensor_name("model.layers.0.post_ffn_norm.weight") == "model.layers.0.post_mlp_layernorm.weight"
    assert lfm2_tensor_name("model.layers.0.operator_norm.weight") == "model.layers.0.input_layernorm.weight"


@pytest.mark.parametrize(("change", "message"), [
    ({"layer_types": ["conv"] * 24}, "no attention layer"),
    ({"layer_types": ["conv", "mamba"] * 12}, "layer_types must list 24 of conv, full_attention, sliding_attention"),
    ({"conv_bias": True}, "conv_bias is not supported"),
    ({"attention_bias": True}, "attention_bias is not supported"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "the sliding layers' rope must be plain"),
])
def test_what_it_cannot_serve_is_refused_by_name(change, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(LFM3 | change)


def test_the_bandwidth_floor_counts_the_gates(family_dir):
    from services.engine.random_llama import weight_bytes
    from services.engine.weights import load_weights
    from tests.engine.tiny_families import load_reference

    path = family_dir("lfm2-lfm3")
    model = load_reference(path)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # the conv's weight is 3-D: not counted
    assert weight_bytes(load_weights(path).config, 2) == 2 * matrices  # the tied table, counted once as the head

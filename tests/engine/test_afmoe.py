"""Arcee's AFMoE (Trinity) beyond the family test's float32 parity (tests/engine/test_model_families.py):
``AfmoeConfig``'s shape reads into sliding layers with rope around full ones without, gated attention, sandwich norms
and sigmoid-routed experts; muP's embedding scale; the released names; refusals by name."""

from __future__ import annotations

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.afmoe import afmoe_tensor_name
from services.engine.model.registry import config_from_hf

AFMOE = {"architectures": ["AfmoeForCausalLM"], "model_type": "afmoe"}  # the rest: AfmoeConfig's defaults


def test_the_default_shape_reads_windows_with_rope_around_full_layers_without():
    cfg = config_from_hf(AFMOE)
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.head_dim) == ("afmoe", 32, 2048, 128)
    full = tuple(range(3, 32, 4))  # every fourth layer
    assert cfg.nope_layers == full and all(cfg.layer_windows[i] is None for i in full)
    assert {cfg.layer_windows[i] for i in range(32) if i not in full} == {1024}
    assert cfg.qk_norm and cfg.attention_value_gate and not cfg.attention_head_gate and cfg.sandwich_norms
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.sparse_layers, moe.shared_expert_intermediate_size) == \
        (64, 6, tuple(range(1, 32)), 2 * 1408)
    assert moe.sigmoid_routing and moe.norm_topk_prob and moe.expert_groups == 1 and cfg.multipliers is None
    assert config_from_hf(AFMOE | {"mup_enabled": True}).multipliers.embedding == pytest.approx(2048**0.5)


@pytest.mark.parametrize(("checkpoint", "decoder"), [
    ("model.layers.2.post_attention_layernorm.weight", "model.layers.2.post_self_attn_layernorm.weight"),
    ("model.layers.2.pre_mlp_layernorm.weight", "model.layers.2.post_attention_layernorm.weight"),
    ("model.layers.2.post_mlp_layernorm.weight", "model.layers.2.post_mlp_layernorm.weight"),
    ("model.layers.2.self_attn.gate_proj.weight", "model.layers.2.self_attn.g_proj.weight"),
    ("model.layers.2.mlp.router.gate.weight", "model.layers.2.mlp.gate.weight"),
    ("model.layers.2.mlp.expert_bias", "model.layers.2.mlp.gate.e_score_correction_bias"),
    ("model.layers.2.mlp.shared_experts.down_proj.weight", "model.layers.2.mlp.shared_expert.down_proj.weight"),
    ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"),  # the dense layer's: its own
    ("model.layers.2.mlp.experts.5.up_proj.weight", "model.layers.2.mlp.experts.5.up_proj.weight"),
])
def test_the_released_names_map_onto_the_shared_decoder(checkpoint, decoder):
    assert afmoe_tensor_name(checkpoint) == decoder


def test_what_is_not_served_is_refused_by_name():
    with pytest.raises(ModelLoadError, match="attention_bias is not supported"):
        config_from_hf(AFMOE | {"attention_bias": True})
    with pytest.raises(ModelLoadError, match=r"(?s)afmoe: config\.json is not a AfmoeConfig .*layer_types"):
        config_from_hf(AFMOE | {"layer_types": ["full_attention"] * 3})

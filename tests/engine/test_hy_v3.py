"""Tencent's Hy3 beyond the family test's float32 parity (tests/engine/test_model_families.py): the published shape
(``HYV3Config``'s defaults, which document Hy3-preview) reads into Qwen3's attention, a dense first layer and
sigmoid-routed experts with one shared; the released tensor names map onto the shared decoder's; the multi-token-
prediction layer is not read; what is not served is refused by name."""

from __future__ import annotations

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.hy_v3 import hy_v3_tensor_name
from services.engine.model.registry import config_from_hf, tensor_renamer

# the shape HYV3Config's defaults describe (its documented checkpoint: tencent/Hy3-preview), written out
HY3 = {"architectures": ["HYV3ForCausalLM"], "model_type": "hy_v3", "num_hidden_layers": 80, "hidden_size": 4096,
       "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "num_experts": 192,
       "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 1536,
       "router_scaling_factor": 2.826, "vocab_size": 120832}


def test_the_published_shape_reads_qwen3_attention_and_sigmoid_routed_experts():
    hy3 = config_from_hf(HY3)
    assert (hy3.architecture, hy3.num_layers, hy3.num_heads, hy3.num_kv_heads, hy3.head_dim) == \
        ("hy_v3", 80, 64, 8, 128)
    assert hy3.qk_norm and not hy3.qk_norm_whole and not hy3.qkv_bias and hy3.rope_theta == 11158840.0
    moe = hy3.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.sparse_layers) == (192, 8, 1536, tuple(range(1, 80)))
    assert moe.sigmoid_routing and moe.norm_topk_prob and moe.routed_scaling == pytest.approx(2.826)
    assert (moe.expert_groups, moe.shared_expert_intermediate_size, moe.shared_expert_gated) == (1, 1536, False)
    assert hy3.intermediate_size == 13312  # the dense first layer's (HYV3Config's default)


@pytest.mark.parametrize(("checkpoint", "decoder"), [
    ("model.layers.3.mlp.router.gate.weight", "model.layers.3.mlp.gate.weight"),
    ("model.layers.3.mlp.expert_bias", "model.layers.3.mlp.gate.e_score_correction_bias"),
    ("model.layers.3.mlp.shared_mlp.up_proj.weight", "model.layers.3.mlp.shared_expert.up_proj.weight"),
    ("model.layers.3.mlp.experts.7.down_proj.weight", "model.layers.3.mlp.experts.7.down_proj.weight"),
    ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"),
])
def test_the_released_names_map_onto_the_shared_decoder(checkpoint, decoder):
    assert hy_v3_tensor_name(checkpoint) == decoder


def test_the_multi_token_prediction_layer_is_not_read():
    rename = tensor_renamer(config_from_hf(HY3))
    assert rename("model.layers.80.mlp.router.gate.weight") is None
    assert rename("model.layers.79.mlp.router.gate.weight") == "model.layers.79.mlp.gate.weight"


@pytest.mark.parametrize(("change", "named"), [
    ({"attention_bias": True}, "attention_bias is not supported"),
    ({"mlp_bias": True}, "mlp_bias is not supported"),
    ({"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types must list 80"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(HY3 | change)

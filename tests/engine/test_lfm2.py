"""LFM2's config as its first releases write it (``full_attn_idxs``, ``block_ff_dim``, no ``layer_types``; LFM2-1.2B's
``config.json``) with the MLP width transformers derives, LFM2-MoE's (LFM2-8B-A1B's shape), their tensor names, and
refusals by name. The family test serves the tiny checkpoints exactly (tests/engine/test_model_families.py)."""

from __future__ import annotations

import pytest

from services.engine.errors import ModelLoadError
from services.engine.model.lfm2 import lfm2_tensor_name
from services.engine.model.registry import config_from_hf

RELEASED = {  # LFM2-1.2B
    "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": True, "block_dim": 2048, "block_ff_dim": 12288,
    "block_ffn_dim_multiplier": 1.0, "block_mlp_init_scale": 1.0, "block_multiple_of": 256, "block_norm_eps": 1e-05,
    "block_out_init_scale": 1.0, "block_use_swiglu": True, "block_use_xavier_init": True, "bos_token_id": 1,
    "conv_L_cache": 3, "conv_bias": False, "conv_dim": 2048, "conv_dim_out": 2048, "conv_use_xavier_init": True,
    "eos_token_id": 7, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "hidden_size": 2048, "initializer_range": 0.02,
    "max_position_embeddings": 128000, "model_type": "lfm2", "norm_eps": 1e-05, "num_attention_heads": 32,
    "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pad_token_id": 0, "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16", "use_cache": True, "use_pos_enc": True, "vocab_size": 65536,
}


def test_the_released_config_reads_as_transformers_builds_it():
    cfg = config_from_hf(RELEASED)
    assert cfg.architecture == "lfm2" and cfg.num_layers == 16 and cfg.head_dim == 64
    assert cfg.kv_layers == (2, 5, 8, 10, 12, 14)
    assert cfg.short_conv.layers == (0, 1, 3, 4, 6, 7, 9, 11, 13, 15)
    assert (cfg.short_conv.conv_dim, cfg.short_conv.conv_kernel) == (2048, 3)
    assert cfg.intermediate_size == 8192  # two thirds of block_ff_dim, rounded up to block_multiple_of
    assert cfg.qk_norm and not cfg.qk_norm_whole and cfg.tie_word_embeddings and cfg.rope_theta == 1e6
    assert cfg.rms_norm_eps == 1e-5 and cfg.eos_token_ids == (7,)
    assert cfg.short_conv.state_bytes(2) == 10 * 2048 * 2 * 2  # each conv layer's last 2 inputs, bf16
    assert not config_from_hf(RELEASED | {"tie_embedding": False}).tie_word_embeddings  # the first releases' key


MOE = {  # LFM2-8B-A1B's shape
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "hidden_size": 2048, "intermediate_size": 7168,
    "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_experts": 32, "num_experts_per_tok": 4, "num_dense_layers": 2, "norm_topk_prob": True,
    "use_expert_bias": True, "routed_scaling_factor": 1.0, "conv_L_cache": 3, "conv_bias": False,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "conv"] * 4, "vocab_size": 65536,
    "max_position_embeddings": 128000, "rope_theta": 1000000.0, "norm_eps": 1e-05, "tie_embedding": True,
}


def test_lfm2_moe_reads_its_experts_after_its_dense_layers():
    cfg = config_from_hf(MOE)
    assert cfg.architecture == "lfm2" and cfg.intermediate_size == 7168  # the dense layers' width, as stored
    assert cfg.kv_layers == (2, 8, 14, 20) and len(cfg.short_conv.layers) == 20
    moe = cfg.moe
    assert moe.sparse_layers == tuple(range(2, 24)) and (moe.num_experts, moe.top_k) == (32, 4)
    assert moe.intermediate_size == 1792 and moe.sigmoid_routing and moe.correction_bias and moe.norm_topk_prob
    assert (moe.routed_scaling, moe.norm_epsilon, moe.expert_groups) == (1.0, 1e-6, 1)
    assert cfg.tie_word_embeddings and cfg.qk_norm
    with pytest.raises(ModelLoadError, match="lfm2_moe: use_expert_bias false is not supported"):
        config_from_hf(MOE | {"use_expert_bias": False})


def test_the_mlp_width_is_transformers_for_other_settings():
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    for change in ({"block_multiple_of": 96}, {"block_auto_adjust_ff_dim": False},
                   {"block_ffn_dim_multiplier": 1.3}):
        settings = {**RELEASED, **change, "hidden_size": 64, "block_ff_dim": 500}
        want = Lfm2MLP(Lfm2Config(**settings)).w1.out_features
        assert config_from_hf(settings).intermediate_size == want, change


@pytest.mark.parametrize(("change", "message"), [
    ({"full_attn_idxs": []}, "no attention layer"),
    ({"layer_types": ["conv", "mamba"] * 8}, "layer_types must list 16 of conv, full_attention"),
    ({"conv_L_cache": 1}, "short conv kernel must be >= 2"),
    ({"conv_bias": True}, "conv_bias is not supported"),
])
def test_what_it_cannot_serve_is_refused_by_name(change, message):
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(RELEASED | change)


def test_the_released_tensor_names():
    assert lfm2_tensor_name("model.embedding_norm.weight") == "model.norm.weight"
    assert lfm2_tensor_name("model.layers.0.operator_norm.weight") == "model.layers.0.input_layernorm.weight"
    assert lfm2_tensor_name("model.layers.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert lfm2_tensor_name("model.layers.3.feed_forward.w3.weight") == "model.layers.3.mlp.up_proj.weight"
    assert lfm2_tensor_name("model.layers.2.self_attn.out_proj.weight") == "model.layers.2.self_attn.o_proj.weight"
    assert lfm2_tensor_name("model.layers.2.self_attn.k_layernorm.weight") == "model.layers.2.self_attn.k_norm.weight"
    assert lfm2_tensor_name("model.layers.0.conv.out_proj.weight") == "model.layers.0.conv.out_proj.weight"
    assert lfm2_tensor_name("model.layers.0.conv.conv.weight") == "model.layers.0.conv.conv.weight"
    # LFM2-MoE's: per-expert SwiGLUs (or transformers 5's stacked ones), the router and its choice bias
    assert lfm2_tensor_name("model.layers.5.feed_forward.experts.31.w1.weight") == \
        "model.layers.5.mlp.experts.31.gate_proj.weight"
    assert lfm2_tensor_name("model.layers.5.feed_forward.experts.0.w2.weight") == \
        "model.layers.5.mlp.experts.0.down_proj.weight"
    assert lfm2_tensor_name("model.layers.5.feed_forward.experts.gate_up_proj") == \
        "model.layers.5.mlp.experts.gate_up_proj"
    assert lfm2_tensor_name("model.layers.5.feed_forward.gate.weight") == "model.layers.5.mlp.gate.weight"
    assert lfm2_tensor_name("model.layers.5.feed_forward.expert_bias") == \
        "model.layers.5.mlp.gate.e_score_correction_bias"


def test_the_deterministic_mode_is_refused_by_name(family_dir):
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine

    with pytest.raises(ModelLoadError, match="lfm2 is not served in the deterministic mode"):
        LLMEngine.from_config(EngineConfig(model_path=str(family_dir("lfm2")), dtype="float32", num_kv_blocks=16,
                                           deterministic=True))


def test_the_weights_a_step_reads_are_its_matrices(family_dir):
    """The bandwidth floor's count (``random_llama.weight_bytes``): a convolution layer's in and out projections, an
    attention layer's, every MLP."""
    from services.engine.random_llama import weight_bytes
    from services.engine.weights.model_config_reader import read_hf_config
    from tests.engine.tiny_families import load_reference

    path = family_dir("lfm2")
    model = load_reference(path)
    cfg = config_from_hf(read_hf_config(path))
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # the conv's weight is 3-D: not counted
    assert weight_bytes(cfg, 2) == 2 * matrices  # the tied table, counted once as the head

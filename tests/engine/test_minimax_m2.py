"""MiniMax-M2 beyond the family tests' float32 parity (tests/engine/test_model_families.py): the published config
reads into whole-width q/k norms, rope on 64 of 128 dims and sigmoid-routed experts; the partial rope and the
correction bias are what make the logits transformers'; the checkpoint's names (an FP8 file's scales too) map onto
the shared decoder's; what is not served is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.minimax_m2 import minimax_m2_tensor_name
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import exactness_probe

# the shape of MiniMaxAI/MiniMax-M2's config.json (its quantization_config aside: see test_fp8_checkpoints.py)
MINIMAX_M2 = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_size": 3072, "head_dim": 128,
    "intermediate_size": 1536, "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8,
    "num_local_experts": 256, "num_experts_per_tok": 8, "rotary_dim": 64, "rope_theta": 5000000,
    "max_position_embeddings": 196608, "rms_norm_eps": 1e-06, "vocab_size": 200064, "scoring_func": "sigmoid",
    "use_routing_bias": True, "use_qk_norm": True, "qk_norm_type": "per_layer", "shared_intermediate_size": 0,
    "num_mtp_modules": 3, "mtp_transformer_layers": 1, "tie_word_embeddings": False, "bos_token_id": 200019,
    "eos_token_id": 200020, "hidden_act": "silu",
}


def test_the_published_config_reads_whole_width_norms_partial_rope_and_sigmoid_experts():
    config = config_from_hf(MINIMAX_M2)
    assert (config.architecture, config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim,
            config.rotary_dim) == ("minimax_m2", 62, 48, 8, 128, 64)
    assert config.qk_norm and config.qk_norm_whole and config.rope_theta == 5000000
    moe = config.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.sparse_layers) == (256, 8, 1536, tuple(range(62)))
    assert moe.sigmoid_routing and moe.norm_topk_prob and moe.routed_scaling == 1.0
    assert moe.expert_groups == 1 and moe.shared_expert_intermediate_size is None


@pytest.mark.parametrize(("change", "named"), [
    ({"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ({"qk_norm_type": "per_head"}, "qk_norm_type 'per_head'"),
    ({"shared_intermediate_size": 1536}, "shared expert"),
    ({"num_local_experts": None}, "num_local_experts"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(MINIMAX_M2 | change)


@pytest.mark.parametrize(("checkpoint", "decoder"), [
    ("model.layers.3.block_sparse_moe.experts.7.w1.weight", "model.layers.3.mlp.experts.7.gate_proj.weight"),
    ("model.layers.3.block_sparse_moe.experts.7.w3.weight_scale_inv",
     "model.layers.3.mlp.experts.7.up_proj.weight_scale_inv"),
    ("model.layers.3.block_sparse_moe.experts.0.w2.weight", "model.layers.3.mlp.experts.0.down_proj.weight"),
    ("model.layers.3.block_sparse_moe.gate.weight", "model.layers.3.mlp.gate.weight"),
    ("model.layers.3.block_sparse_moe.e_score_correction_bias", "model.layers.3.mlp.gate.e_score_correction_bias"),
    ("model.layers.3.self_attn.q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),
])
def test_checkpoint_names_map_onto_the_shared_decoder(checkpoint, decoder):
    assert minimax_m2_tensor_name(checkpoint) == decoder


def test_the_partial_rope_and_the_correction_bias_are_what_make_it_exact(family_dir):
    weights, expected, logits = exactness_probe(family_dir("minimax_m2"), _prompts()["long"][:64])

    assert torch.allclose(logits(), expected, atol=1e-4, rtol=1e-4)
    assert (logits(dataclasses.replace(weights.config, rotary_dim=None)) - expected).abs().max() > 1e-2
    unbiased = {n: torch.zeros_like(t) if n.endswith("e_score_correction_bias") else t
                for n, t in weights.tensors.items()}
    assert (logits(tensors=unbiased) - expected).abs().max() > 1e-2

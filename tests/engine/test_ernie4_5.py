"""ERNIE 4.5 beyond the family tests' float32 parity (tests/engine/test_model_families.py): configs shaped as
the released ones read into interleaved rope and (the MoE) softmax routing with a biased choice; the interleaving
and the correction bias are what make the logits transformers'; the checkpoint's names map (its correction bias,
its shared experts, its multi-token-prediction weights not read); ``use_bias`` is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.decoder import DecoderModel
from services.engine.model.ernie4_5 import ernie4_5_tensor_name
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# shaped as baidu/ERNIE-4.5-21B-A3B-PT's config.json
ERNIE_MOE = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 2560, "intermediate_size": 12288, "max_position_embeddings": 131072, "model_type": "ernie4_5_moe",
    "num_attention_heads": 20, "num_key_value_heads": 4, "num_hidden_layers": 28, "pad_token_id": 0,
    "rms_norm_eps": 1e-05, "vocab_size": 103424, "rope_theta": 500000, "use_bias": False, "tie_word_embeddings": True,
    "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_intermediate_size": 1536, "moe_k": 6,
    "moe_layer_interval": 1, "moe_num_experts": 64, "moe_num_shared_experts": 2, "head_dim": 128,
}


def test_the_released_shapes_read_interleaved_rope_and_biased_softmax_routing():
    cfg = config_from_hf(ERNIE_MOE)
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("ernie4_5", 28, 20, 4, 128)
    assert cfg.rope_interleaved and cfg.rotary_dim is None and cfg.tie_word_embeddings
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.sparse_layers) == (64, 6, 1536, tuple(range(1, 28)))
    assert moe.biased_choice and not moe.sigmoid_routing and moe.float32_router and moe.norm_topk_prob
    assert (moe.shared_expert_intermediate_size, moe.shared_expert_gated) == (3072, False)
    dense = config_from_hf({**ERNIE_MOE, "model_type": "ernie4_5", "architectures": ["Ernie4_5ForCausalLM"]})
    assert dense.moe is None and dense.rope_interleaved
    every_other = config_from_hf({**ERNIE_MOE, "moe_layer_interval": 2, "moe_layer_end_index": -1})
    assert every_other.moe.sparse_layers == tuple(range(1, 28, 2))
    with pytest.raises(ModelLoadError, match="use_bias"):
        config_from_hf({**ERNIE_MOE, "use_bias": True})
    with pytest.raises(ModelLoadError, match="moe_layer_interval"):
        config_from_hf({**ERNIE_MOE, "moe_layer_interval": 0})
    # Ernie4_5Config's defaults where a config leaves them out: rope base 500000, the dense head 128 wide
    bare = config_from_hf({k: v for k, v in dense_config().items() if k not in ("rope_theta", "head_dim")})
    assert (bare.rope_theta, bare.head_dim) == (500000.0, 128)


def dense_config() -> dict:
    return {**ERNIE_MOE, "model_type": "ernie4_5", "architectures": ["Ernie4_5ForCausalLM"], "hidden_size": 1024,
            "num_attention_heads": 16, "num_key_value_heads": 2}


@pytest.mark.parametrize(("checkpoint", "decoder"), [
    ("model.layers.3.mlp.moe_statics.e_score_correction_bias", "model.layers.3.mlp.gate.e_score_correction_bias"),
    ("model.layers.3.mlp.gate.moe_statics.e_score_correction_bias", "model.layers.3.mlp.gate.e_score_correction_bias"),
    ("model.layers.3.mlp.shared_experts.up_proj.weight", "model.layers.3.mlp.shared_expert.up_proj.weight"),
    ("model.layers.3.mlp.experts.5.down_proj.weight", "model.layers.3.mlp.experts.5.down_proj.weight"),
    ("model.mtp_block.0.self_attn.q_proj.weight", None),
    ("model.mtp_linear_proj.0.weight", None),
])
def test_checkpoint_names_map_onto_the_shared_decoder(checkpoint, decoder):
    assert ernie4_5_tensor_name(checkpoint) == decoder


@pytest.mark.parametrize("family", ["ernie4_5", "ernie4_5-moe"])
def test_interleaving_and_the_biased_choice_are_what_make_it_exact(family, family_dir):
    """A prompt's logits equal transformers'; rotating the halves, or (the MoE) choosing without the correction
    bias, is far from them."""
    path = family_dir(family)
    weights = load_weights(path)
    prompt = _prompts()["short"]
    expected = hf_logits(load_reference(path), prompt)

    def logits(config, tensors=weights.tensors) -> torch.Tensor:
        return pdserve_logits(DecoderModel(config, tensors, torch.float32), prompt)

    assert torch.allclose(logits(weights.config), expected, atol=1e-4, rtol=1e-4)
    assert (logits(dataclasses.replace(weights.config, rope_interleaved=False)) - expected).abs().max() > 1e-2
    if weights.config.moe is not None:
        unbiased = {n: torch.zeros_like(t) if n.endswith("e_score_correction_bias") else t
                    for n, t in weights.tensors.items()}
        assert (logits(weights.config, unbiased) - expected).abs().max() > 1e-2

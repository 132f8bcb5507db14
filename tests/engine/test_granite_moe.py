"""IBM Granite 3.x MoE beyond the family tests' float32 parity (tests/engine/test_model_families.py, GGUF in
tests/engine/test_gguf_families.py): a config shaped as the published ones reads into Granite's scalars and
experts routed by the softmax of the top-k logits; the shared variant's MLP has no gate; the checkpoints' tensor
names (and transformers 5's) map onto the shared decoder's; and the routing is what makes the parity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.decoder import DecoderModel
from services.engine.model.granite_moe import granite_moe_tensor_name
from services.engine.model.registry import config_from_gguf, config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# the shape of ibm-granite/granite-3.1-1b-a400m-instruct's config.json
GRANITE_MOE_1B = {
    "architectures": ["GraniteMoeForCausalLM"], "attention_bias": False, "attention_multiplier": 0.015625,
    "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 1024,
    "intermediate_size": 512, "logits_scaling": 6.0, "max_position_embeddings": 131072, "model_type": "granitemoe",
    "num_attention_heads": 16, "num_experts_per_tok": 8, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "residual_multiplier": 0.22, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000000.0, "tie_word_embeddings": True, "vocab_size": 49155,
}


def test_the_published_shape_reads_granite_s_scalars_and_its_experts():
    cfg = config_from_hf(GRANITE_MOE_1B)
    assert (cfg.architecture, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("granite_moe", 1024, 24, 16, 8, 64)
    scalars = cfg.multipliers
    assert (scalars.embedding, scalars.attention, scalars.residual, scalars.logits_divisor) == \
        (12.0, 0.015625, 0.22, 6.0)
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.sparse_layers) == (32, 8, 512, tuple(range(24)))
    assert moe.softmax_after_topk and moe.shared_expert_intermediate_size is None
    shared = config_from_hf(GRANITE_MOE_1B | {"model_type": "granitemoeshared", "shared_intermediate_size": 1024})
    assert shared.moe.shared_expert_intermediate_size == 1024 and not shared.moe.shared_expert_gated
    none_shared = config_from_hf(GRANITE_MOE_1B | {"model_type": "granitemoeshared", "shared_intermediate_size": 0})
    assert none_shared.moe.shared_expert_intermediate_size is None  # transformers: 0 is no shared MLP


def test_a_config_without_its_experts_names_the_field():
    with pytest.raises(ModelLoadError, match="num_local_experts"):
        config_from_hf({k: v for k, v in GRANITE_MOE_1B.items() if k != "num_local_experts"})


def test_a_llama_cpp_file_reads_scales_experts_and_the_shared_width():
    fields = {"general.architecture": "granitemoe", "granitemoe.block_count": 24,
              "granitemoe.context_length": 131072, "granitemoe.embedding_length": 1024,
              "granitemoe.feed_forward_length": 512, "granitemoe.attention.head_count": 16,
              "granitemoe.attention.head_count_kv": 8, "granitemoe.attention.layer_norm_rms_epsilon": 1e-6,
              "granitemoe.rope.freq_base": 1e7, "granitemoe.expert_count": 32, "granitemoe.expert_used_count": 8,
              "granitemoe.embedding_scale": 12.0, "granitemoe.residual_scale": 0.22,
              "granitemoe.attention.scale": 0.015625, "granitemoe.logit_scale": 6.0,
              "tokenizer.ggml.eos_token_id": 0, "pdserve.derived_vocab_size": 49155}
    cfg = config_from_gguf(fields)
    assert cfg.architecture == "granite_moe" and cfg.multipliers.logits_divisor == 6.0
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.intermediate_size) == (32, 8, 512)
    assert cfg.moe.shared_expert_intermediate_size is None
    shared = config_from_gguf(fields | {"granitemoe.expert_shared_feed_forward_length": 1024})
    assert shared.moe.shared_expert_intermediate_size == 1024 and not shared.moe.shared_expert_gated


@pytest.mark.parametrize(("checkpoint", "decoder"), [
    ("model.layers.3.block_sparse_moe.input_linear.weight", "model.layers.3.mlp.experts.gate_up_proj"),
    ("model.layers.3.block_sparse_moe.output_linear.weight", "model.layers.3.mlp.experts.down_proj"),
    ("model.layers.3.block_sparse_moe.router.layer.weight", "model.layers.3.mlp.gate.weight"),
    ("model.layers.3.block_sparse_moe.experts.gate_up_proj", "model.layers.3.mlp.experts.gate_up_proj"),
    ("model.layers.3.block_sparse_moe.router.weight", "model.layers.3.mlp.gate.weight"),
    ("model.layers.3.shared_mlp.input_linear.weight", "model.layers.3.mlp.shared_expert.gate_up_proj.weight"),
    ("model.layers.3.shared_mlp.output_linear.weight", "model.layers.3.mlp.shared_expert.down_proj.weight"),
    ("model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.q_proj.weight"),
])
def test_checkpoint_names_map_onto_the_shared_decoder(checkpoint, decoder):
    assert granite_moe_tensor_name(checkpoint) == decoder


@pytest.mark.parametrize("family", ["granite_moe", "granite_moe-shared"])
def test_the_softmax_of_the_top_k_is_what_makes_it_exact(family, family_dir):
    """A prompt's logits equal transformers'; the same weights routed as Qwen-MoE without ``norm_topk_prob``
    routes (the top-k of the softmax over every expert, not renormalised) are far from them."""
    path = family_dir(family)
    weights = load_weights(path)
    prompt = _prompts()["short"]
    expected = hf_logits(load_reference(path), prompt)

    def logits(config) -> torch.Tensor:
        return pdserve_logits(DecoderModel(config, weights.tensors, torch.float32), prompt)

    assert torch.allclose(logits(weights.config), expected, atol=1e-4, rtol=1e-4)
    unnormalised = dataclasses.replace(weights.config.moe, softmax_after_topk=False, norm_topk_prob=False)
    assert (logits(dataclasses.replace(weights.config, moe=unnormalised)) - expected).abs().max() > 1e-2


def test_the_grouped_experts_path_reads_the_stacked_tensors_alike(family_dir):
    """GPUs run a sparse layer's experts as grouped GEMMs over the stacked tensors: on Granite MoE's (with its
    shared MLP) they give the per-expert loop's logits."""
    weights = load_weights(family_dir("granite_moe-shared"))
    prompt = _prompts()["short"]
    looped, grouped = (pdserve_logits(DecoderModel(weights.config, weights.tensors, torch.float32,
                                                   grouped_experts=flag), prompt) for flag in (False, True))
    assert torch.allclose(grouped, looped, atol=1e-5, rtol=1e-5)

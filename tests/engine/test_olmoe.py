"""OLMoE beyond the family tests' float32 parity (tests/engine/test_model_families.py): the published config reads
into whole-width q/k norms and softmax-routed experts on every layer; the q/k norms and the unrenormalised top-k
weights are what make the logits transformers'; ``clip_qkv`` is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import exactness_probe

# the shape of allenai/OLMoE-1B-7B-0125-Instruct's config.json
OLMOE = {
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64,
    "num_experts_per_tok": 8, "norm_topk_prob": False, "clip_qkv": None, "rope_theta": 10000.0, "rope_scaling": None,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "vocab_size": 50304, "attention_bias": False,
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1,
    "hidden_act": "silu", "output_router_logits": False, "router_aux_loss_coef": 0.01,
}


def test_the_published_config_reads_whole_width_norms_and_softmax_experts_on_every_layer():
    config = config_from_hf(OLMOE)
    assert (config.architecture, config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim,
            config.rms_norm_eps, config.eos_token_ids) == ("olmoe", 16, 16, 16, 128, 1e-05, (50279,))
    assert config.qk_norm and config.qk_norm_whole and not config.qkv_bias
    moe = config.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.sparse_layers) == (64, 8, 1024, tuple(range(16)))
    assert not moe.norm_topk_prob and not moe.sigmoid_routing and moe.shared_expert_intermediate_size is None


@pytest.mark.parametrize(("change", "named"), [
    ({"clip_qkv": 8.0}, "clip_qkv 8.0"),
    ({"num_experts": None}, "num_experts"),
])
def test_what_is_not_served_is_refused_by_name(change, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(OLMOE | change)


def test_the_whole_width_norms_and_the_unrenormalised_weights_are_what_make_it_exact(family_dir):
    weights, expected, logits = exactness_probe(family_dir("olmoe"), _prompts()["long"][:64])

    assert torch.allclose(logits(), expected, atol=1e-4, rtol=1e-4)
    renormalised = dataclasses.replace(weights.config.moe, norm_topk_prob=True)
    assert (logits(dataclasses.replace(weights.config, moe=renormalised)) - expected).abs().max() > 1e-2
    unnormed = {n: torch.ones_like(t) if n.endswith(("q_norm.weight", "k_norm.weight")) else t
                for n, t in weights.tensors.items()}
    assert (logits(tensors=unnormed) - expected).abs().max() > 1e-2

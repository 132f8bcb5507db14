"""GLM-4-0414 beyond the family tests' float32 parity (tests/engine/test_model_families.py): the published config
reads into interleaved rope over half of each head and norms on each block's output; the interleaving and the
output norms are what make the logits transformers'."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.model.decoder import DecoderModel
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# the shape of zai-org/GLM-4-9B-0414's config.json
GLM_4_9B = {
    "architectures": ["Glm4ForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 13696, "max_position_embeddings": 32768, "model_type": "glm4",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 151552,
}


def test_the_published_shape_reads_interleaved_half_rope_and_sandwich_norms():
    cfg = config_from_hf(GLM_4_9B)
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim) == \
        ("glm4", 40, 32, 2, 128, 64)
    assert cfg.rope_interleaved and cfg.sandwich_norms and cfg.qkv_bias and not cfg.o_bias
    assert cfg.eos_token_ids == (151329, 151336, 151338) and cfg.rms_norm_eps == 1e-5
    absent = config_from_hf({k: v for k, v in GLM_4_9B.items() if k not in ("partial_rotary_factor",
                                                                            "attention_bias")})
    assert absent.rotary_dim == 64 and absent.qkv_bias  # Glm4Config's defaults


@pytest.fixture(scope="module")
def glm4(family_dir):
    path = family_dir("glm4")
    return load_weights(path), load_reference(path)


def test_interleaved_rope_and_the_output_norms_are_what_make_it_exact(glm4):
    """A prompt's logits equal transformers'; rotating the halves (Llama's rope), or the output norms swapped for
    the norms before the blocks, are far from them."""
    weights, reference = glm4
    prompt = _prompts()["short"]
    expected = hf_logits(reference, prompt)

    def logits(config, tensors=weights.tensors) -> torch.Tensor:
        return pdserve_logits(DecoderModel(config, tensors, torch.float32), prompt)

    assert torch.allclose(logits(weights.config), expected, atol=1e-4, rtol=1e-4)
    halves = dataclasses.replace(weights.config, rope_interleaved=False)
    assert (logits(halves) - expected).abs().max() > 1e-2
    swapped = dict(weights.tensors)
    for i in range(weights.config.num_layers):
        after, before = f"model.layers.{i}.post_self_attn_layernorm.weight", \
            f"model.layers.{i}.post_attention_layernorm.weight"
        swapped[after], swapped[before] = weights.tensors[before], weights.tensors[after]
    assert (logits(weights.config, swapped) - expected).abs().max() > 1e-2

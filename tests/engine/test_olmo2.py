"""OLMo 2 beyond the family tests' float32 parity (tests/engine/test_model_families.py): a config shaped as the
released 7B's reads into its layer; the norms on the blocks' outputs are what make the logits transformers'."""

from __future__ import annotations

import torch

from services.engine.model.olmo2_decoder import Olmo2DecoderModel
from services.engine.model.registry import config_from_hf, model_class
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# shaped as allenai/OLMo-2-1124-7B's config.json
OLMO2_7B = {
    "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "bos_token_id": None, "eos_token_id": 100257,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pad_token_id": 100277, "rms_norm_eps": 1e-06, "rope_theta": 500000, "tie_word_embeddings": False,
    "vocab_size": 100352,
}


def test_the_released_shape_reads_into_olmo2_s_layer():
    cfg = config_from_hf(OLMO2_7B)
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.max_position) == \
        ("olmo2", 32, 32, 32, 128, 4096)
    assert cfg.eos_token_ids == (100257,) and cfg.rms_norm_eps == 1e-6 and not cfg.qkv_bias
    assert model_class("olmo2") is Olmo2DecoderModel


def test_the_output_norms_are_what_make_it_exact(family_dir):
    """A prompt's logits equal transformers'; the two output norms swapped are far from them."""
    path = family_dir("olmo2")
    weights = load_weights(path)
    prompt = _prompts()["short"]
    expected = hf_logits(load_reference(path), prompt)
    model = Olmo2DecoderModel(weights.config, weights.tensors, torch.float32)
    assert torch.allclose(pdserve_logits(model, prompt), expected, atol=1e-4, rtol=1e-4)
    for layer in model.layers:
        layer.attn_out_norm, layer.mlp_out_norm = layer.mlp_out_norm, layer.attn_out_norm
    assert (pdserve_logits(model, prompt) - expected).abs().max() > 1e-2

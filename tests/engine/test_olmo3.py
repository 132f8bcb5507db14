"""OLMo 3 beyond the family tests' float32 parity (tests/engine/test_model_families.py): a long-context config reads
into OLMo 2's layer with sliding layers and a rope per kind of layer; the sliding layers' own plain rope is what
makes the logits transformers'; a sliding rope with scaling is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.olmo2_decoder import Olmo2DecoderModel
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# a config of allenai/Olmo-3-7B-Instruct's kind (yarn on the full layers, three sliding layers in four)
OLMO3_7B = {
    "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100278,
    "max_position_embeddings": 65536, "rope_theta": 500000, "rms_norm_eps": 1e-06, "sliding_window": 4096,
    "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                     "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1},
    "layer_types": ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(32)],
    "tie_word_embeddings": False, "eos_token_id": 100257, "pad_token_id": 100277,
}


def test_a_long_context_config_reads_sliding_layers_with_their_own_plain_rope():
    config = config_from_hf(OLMO3_7B)
    assert config.architecture == "olmo3" and config.max_position == 65536 and config.rms_norm_eps == 1e-6
    assert config.rope_scaling.rope_type == "yarn" and config.rope_scaling.factor == 8.0
    assert config.layer_windows == tuple(4096 if (i + 1) % 4 else None for i in range(32))
    assert config.local_rope_layers == tuple(i for i in range(32) if (i + 1) % 4)
    assert config.local_rope_theta == 500000


def test_a_sliding_rope_with_scaling_is_refused_by_name():
    scaled = {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0},
              "full_attention": {"rope_type": "default", "rope_theta": 500000.0}}
    config = {k: v for k, v in OLMO3_7B.items() if k not in ("rope_scaling", "rope_theta")}
    with pytest.raises(ModelLoadError, match="sliding layers' rope must be plain"):
        config_from_hf(config | {"rope_parameters": scaled})


def test_the_sliding_layers_own_rope_is_what_makes_it_exact(family_dir):
    """Transformers' logits; the full layers' yarn rope on every layer is far from them."""
    path = family_dir("olmo3")
    weights, reference = load_weights(path), load_reference(path)
    prompt = _prompts()["long"][:64]
    expected = hf_logits(reference, prompt)

    def logits(config) -> torch.Tensor:
        return pdserve_logits(Olmo2DecoderModel(config, weights.tensors, torch.float32), prompt)

    assert torch.allclose(logits(weights.config), expected, atol=1e-4, rtol=1e-4)
    one_rope = dataclasses.replace(weights.config, local_rope_layers=(), local_rope_theta=None)
    assert (logits(one_rope) - expected).abs().max() > 1e-2

"""SmolLM3 beyond the family tests' float32 parity (tests/engine/test_model_families.py): a config shaped as the
published one reads its NoPE layers (every fourth) and no window; ``no_rope_layers`` and its interval are read as
transformers reads them, a malformed list refused naming it; and the unrotated layers and the window are what
make the parity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.decoder import DecoderModel
from services.engine.model.registry import config_from_hf
from services.engine.weights import load_weights
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_families import load_reference
from tests.engine.tiny_gguf import hf_logits, pdserve_logits

# the shape of HuggingFaceTB/SmolLM3-3B's config.json
SMOLLM3_3B = {
    "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "bos_token_id": None, "eos_token_id": 128012,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 65536,
    "mlp_bias": False, "model_type": "smollm3", "no_rope_layer_interval": 4,
    "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(36)], "num_attention_heads": 16,
    "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True,
    "use_sliding_window": False, "vocab_size": 128256,
}


def test_the_published_shape_reads_its_nope_layers_and_no_window():
    cfg = config_from_hf(SMOLLM3_3B)
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("smollm3", 36, 16, 4, 128)
    assert cfg.nope_layers == tuple(range(3, 36, 4)) and cfg.layer_windows == ()
    assert cfg.rope_theta == 5e6 and cfg.max_position == 65536 and cfg.tie_word_embeddings
    by_interval = config_from_hf({k: v for k, v in SMOLLM3_3B.items() if k != "no_rope_layers"}
                                 | {"no_rope_layer_interval": 3})
    assert by_interval.nope_layers == tuple(range(2, 36, 3))  # transformers' rule when no list is given


def test_use_sliding_window_slides_the_nope_layers_unless_layer_types_say_otherwise():
    sliding = config_from_hf(SMOLLM3_3B | {"use_sliding_window": True, "sliding_window": 4096})
    assert [i for i, w in enumerate(sliding.layer_windows) if w == 4096] == list(range(3, 36, 4))
    typed = config_from_hf(SMOLLM3_3B | {"use_sliding_window": True, "sliding_window": 4096,
                                         "layer_types": ["sliding_attention"] * 36})
    assert typed.layer_windows == (4096,) * 36


@pytest.mark.parametrize("listed", [[1, 0], [2] * 36])
def test_a_malformed_no_rope_layers_is_refused_naming_it(listed):
    with pytest.raises(ModelLoadError, match="no_rope_layers"):
        config_from_hf(SMOLLM3_3B | {"no_rope_layers": listed})


def test_the_unrotated_layers_and_the_window_are_what_makes_it_exact(family_dir):
    """A prompt past the window: pdserve's logits equal transformers'; with every layer rotated, or the NoPE
    layer's window dropped, they are far from them."""
    path = family_dir("smollm3")
    weights = load_weights(path)
    assert weights.config.nope_layers == (1,) and weights.config.layer_windows == (None, 24, None)
    prompt = _prompts()["long"][:80]
    expected = hf_logits(load_reference(path), prompt)

    def logits(config) -> torch.Tensor:
        return pdserve_logits(DecoderModel(config, weights.tensors, torch.float32), prompt)

    assert torch.allclose(logits(weights.config), expected, atol=1e-4, rtol=1e-4)
    for wrong in (dataclasses.replace(weights.config, nope_layers=()),
                  dataclasses.replace(weights.config, layer_windows=())):
        assert (logits(wrong) - expected).abs().max() > 1e-2

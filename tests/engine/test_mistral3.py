"""Mistral 3's configs as released, shaped like Mistral Small 3.1's (``mistral3`` around a ``mistral`` text model),
Ministral 3's (around ``ministral3``) and Devstral 2's (``ministral3`` alone, FP8 per tensor), read as transformers
builds them; the attention temperature against transformers' own; refusals by name. The family test serves the tiny
checkpoints exactly (tests/engine/test_model_families.py), an FP8 one too (tests/engine/test_fp8_checkpoints.py)."""

from __future__ import annotations

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.decoder import query_temperature
from services.engine.model.registry import config_from_hf

PIXTRAL = {"head_dim": 64, "hidden_act": "silu", "hidden_size": 1024, "image_size": 1540, "intermediate_size": 4096,
           "model_type": "pixtral", "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14,
           "rope_theta": 10000.0}
MISTRAL_SMALL = {  # Mistral-Small-3.1-24B-Instruct-2503's shape
    "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10, "model_type": "mistral3",
    "multimodal_projector_bias": False, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
    "text_config": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 32768,
                    "max_position_embeddings": 131072, "model_type": "mistral", "num_attention_heads": 32,
                    "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                    "rope_theta": 1000000000.0, "sliding_window": None, "vocab_size": 131072},
    "vision_config": PIXTRAL, "vision_feature_layer": -1, "bos_token_id": 1, "eos_token_id": 2,
}
MINISTRAL_TEXT = {  # Ministral-3-8B's text model (transformers' Ministral3Config defaults)
    "model_type": "ministral3", "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 262144, "num_attention_heads": 32, "num_hidden_layers": 34, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 131072,
    "rope_parameters": {"type": "yarn", "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                        "original_max_position_embeddings": 16384, "max_position_embeddings": 262144,
                        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                        "llama_4_scaling_beta": 0.1},
}
DEVSTRAL_2 = {  # Devstral 2 (123B): ministral3 on its own, FP8 per tensor, no temperature
    "architectures": ["Ministral3ForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 12288, "intermediate_size": 28672, "max_position_embeddings": 262144,
    "model_type": "ministral3", "num_attention_heads": 96, "num_hidden_layers": 88, "num_key_value_heads": 8,
    "pad_token_id": 11, "rms_norm_eps": 1e-05, "sliding_window": None, "tie_word_embeddings": False,
    "vocab_size": 131072,
    "quantization_config": {"activation_scheme": "static", "dequantize": False, "quant_method": "fp8",
                            "weight_block_size": None},
    "rope_parameters": {"beta_fast": 4.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 0.0,
                        "original_max_position_embeddings": 4096, "llama_4_scaling_beta": 0.0,
                        "rope_theta": 1000000.0, "rope_type": "yarn", "type": "yarn"},
}


def test_mistral_small_3_serves_its_mistral_text_model():
    cfg = config_from_hf(MISTRAL_SMALL)
    assert cfg.architecture == "mistral3" and (cfg.hidden_size, cfg.num_layers, cfg.head_dim) == (5120, 40, 128)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.rope_theta, cfg.max_position) == (32, 8, 1e9, 131072)
    assert cfg.rope_scaling is None and not cfg.layer_windows and not cfg.query_temperature_beta
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1
    # Mistral3Config's default ties (transformers 5's reading): the released files store a head of their own, which
    # the loader keeps untied as transformers does (tests/engine/test_qwen_vl.py)
    assert cfg.tie_word_embeddings
    # MistralConfig's default window where the key is absent (every release writes null)
    text = {k: v for k, v in MISTRAL_SMALL["text_config"].items() if k != "sliding_window"}
    assert config_from_hf(MISTRAL_SMALL | {"text_config": text}).layer_windows == (4096,) * 40


def test_ministral_3_reads_yarn_and_the_attention_temperature():
    cfg = config_from_hf({"model_type": "mistral3", "text_config": MINISTRAL_TEXT, "vision_config": PIXTRAL})
    assert cfg.architecture == "mistral3" and (cfg.num_layers, cfg.max_position) == (34, 262144)
    scaling = cfg.rope_scaling
    assert (scaling.rope_type, scaling.factor, scaling.original_max_position) == ("yarn", 16.0, 16384)
    assert (cfg.query_temperature_beta, cfg.query_temperature_period) == (0.1, 16384)
    assert not cfg.layer_windows


def test_devstral_2_has_no_temperature_and_mistral_s_yarn():
    cfg = config_from_hf(DEVSTRAL_2)
    assert (cfg.num_layers, cfg.num_heads, cfg.query_temperature_beta) == (88, 96, 0.0)
    scaling = cfg.rope_scaling
    assert (scaling.factor, scaling.original_max_position, scaling.beta_fast, scaling.mscale_all_dim) == (
        64.0, 4096, 4.0, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_attention_temperature_is_transformers(dtype):
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    cfg = config_from_hf(MINISTRAL_TEXT)
    positions = torch.tensor([0, 1, 16383, 16384, 16385, 32767, 32768, 100000, 262143])
    ours = query_temperature(cfg, positions, dtype)
    theirs = get_llama_4_attn_scale(positions[None], 0.1, 16384).to(dtype)  # [1, 1, T, 1]
    assert ours.shape == (9, 1, 1) and torch.equal(ours.flatten(), theirs.flatten())
    assert ours[0].item() == ours[2].item() == 1.0 and ours[3].item() > 1.0  # 1 within the first period


@pytest.mark.parametrize(("config", "named"), [
    (MISTRAL_SMALL | {"text_config": MISTRAL_SMALL["text_config"] | {"model_type": "llama"}},
     "text model of type 'llama' is not supported"),
    (MINISTRAL_TEXT | {"rope_parameters": {k: v for k, v in MINISTRAL_TEXT["rope_parameters"].items()
                                           if k != "llama_4_scaling_beta"}}, "no llama_4_scaling_beta"),
    (MINISTRAL_TEXT | {"rope_parameters": {k: v for k, v in MINISTRAL_TEXT["rope_parameters"].items()
                                           if k != "original_max_position_embeddings"}},
     "without original_max_position_embeddings"),
])
def test_what_is_not_served_is_refused_by_name(config, named):
    with pytest.raises(ModelLoadError, match=named):
        config_from_hf(config)


def test_a_decoder_of_its_own_refuses_a_query_temperature_it_would_not_apply(family_dir):
    """The temperature lives in the shared decoder's layer: a family whose decoder replaces the layer loop or the
    attention (the hybrids', latent attention's) would drop it silently, so such a pairing is refused."""
    from services.engine.model.decoder import DecoderModel
    from services.engine.weights import load_weights

    class OwnLoop(DecoderModel):
        def final_hidden(self, *args, **kwargs):
            raise AssertionError("not run")

    weights = load_weights(family_dir("mistral3-text"))
    assert weights.config.query_temperature_beta == 0.1
    with pytest.raises(ModelLoadError, match="mistral3: its decoder has no query temperature"):
        OwnLoop(weights.config, weights.tensors, torch.float32)
    DecoderModel(weights.config, weights.tensors, torch.float32)  # the shared one applies it

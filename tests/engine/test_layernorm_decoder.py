"""The LayerNorm decoder (``ModelConfig.layer_norm``: StarCoder2's and Jais 2's layers) beyond the family test's
greedy parity: StarCoder2's tiny checkpoint gives transformers' logits, and its LayerNorms' biases, the MLP's biases
and its tanh GELU are each what makes them so; a config another decoder cannot run is refused by name; the
released configs read into their windows and biases."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.errors import ModelLoadError
from services.engine.model.decoder import DecoderModel
from services.engine.model.registry import config_from_hf
from tests.engine.test_model_families import _prompts
from tests.engine.tiny_gguf import assert_each_part_matters, exactness_probe


def test_starcoder2_logits_are_transformers_and_its_biases_and_gelu_make_them_so(family_dir):
    weights, expected, logits = exactness_probe(family_dir("starcoder2"), _prompts()["long"])

    def zeroed(suffix: str) -> dict:
        return {"tensors": {name: torch.zeros_like(t) if name.endswith(suffix) else t
                            for name, t in weights.tensors.items()}}

    assert_each_part_matters(logits, expected, {
        "the LayerNorms' biases": zeroed("layernorm.bias"), "the final LayerNorm's bias": zeroed("model.norm.bias"),
        "the MLP's biases": zeroed("mlp.up_proj.bias"),
        "the tanh GELU": {"config": dataclasses.replace(weights.config, mlp_activation="relu2")}})


def test_a_layer_norm_config_under_rms_norm_layers_is_refused_by_name(family_dir):
    from services.engine.weights import load_weights

    weights = load_weights(family_dir("starcoder2"))
    with pytest.raises(ModelLoadError, match="starcoder2: LayerNorm layers run in LayerNormDecoderModel only"):
        DecoderModel(weights.config, dict(weights.tensors), torch.float32)


def test_released_configs_read_their_windows_biases_and_activations():
    """bigcode/starcoder2-7b's keys (4096 window of 16384, biases, tanh GELU) and Jais 2's defaults."""
    starcoder = config_from_hf({"model_type": "starcoder2", "hidden_size": 4608, "intermediate_size": 18432,
                                "num_attention_heads": 36, "num_key_value_heads": 4, "num_hidden_layers": 32,
                                "max_position_embeddings": 16384, "sliding_window": 4096, "norm_epsilon": 1e-5,
                                "rope_theta": 1000000, "use_bias": True, "vocab_size": 49152,
                                "hidden_act": "gelu_pytorch_tanh"})
    assert starcoder.layer_windows == (4096,) * 32 and starcoder.max_position == 16384
    assert (starcoder.layer_norm, starcoder.mlp_bias, starcoder.qkv_bias, starcoder.o_bias) == (True,) * 4
    assert starcoder.mlp_activation == "gelu_tanh" and starcoder.rms_norm_eps == 1e-5
    jais = config_from_hf({"model_type": "jais2"})
    assert (jais.layer_norm, jais.mlp_bias, jais.qkv_bias, jais.mlp_activation) == (True, True, True, "relu2")
    with pytest.raises(ModelLoadError, match="starcoder2: hidden_act 'silu' is not supported"):
        config_from_hf({"model_type": "starcoder2", "hidden_act": "silu"})

"""NVIDIA's Nemotron-4 and Minitron (Nemotron-Mini-4B, Minitron-4B/8B, Mistral-NeMo-Minitron-8B;
``NemotronForCausalLM``, ``nemotron``): LayerNorms with biases that scale by ``1 + weight`` (``LayerNorm1P``:
:mod:`services.engine.model.layernorm_decoder`), an ungated squared-ReLU MLP (``up_proj``/``down_proj``, biases where
``mlp_bias``), rope on the leading ``partial_rotary_factor`` of each head (half where unset), q/k/v/o biases where
``attention_bias``; read as ``NemotronConfig`` completes it (``norm_eps``). Another ``hidden_act`` is refused by
name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_layer_norm_fields
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = GGUF_ARCHITECTURE = "nemotron"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import NemotronConfig

    full = with_defaults(ARCHITECTURE, NemotronConfig, cfg)
    if full.get("hidden_act") != "relu2":
        raise ModelLoadError(f"nemotron: hidden_act {full.get('hidden_act')!r} is not supported (only relu2)")
    fields = base_fields({**full, "rms_norm_eps": full["norm_eps"]}, ARCHITECTURE, check_mlp=False,
                         partial_rotary=True)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, mlp_bias=bool(full.get("mlp_bias")),
                       mlp_activation="relu2", layer_norm=True, layer_norm_plus_one=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``nemotron`` file's config, read as its loader reads it: the LayerNorms' epsilon
    (``attention.layer_norm_epsilon``) and their weights stored as ``1 + weight`` (taken off by the loader, added back
    by the model), the rotated part ``rope.dimension_count``, the biases those the file holds, nothing permuted."""
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    return ModelConfig(**{**gguf_layer_norm_fields(fields, GGUF_ARCHITECTURE), "architecture": ARCHITECTURE},
                       qkv_bias=f.has_tensor(".attn_q.bias"), o_bias=f.has_tensor(".attn_output.bias"),
                       mlp_bias=f.has_tensor(".ffn_up.bias"), mlp_activation="relu2", layer_norm=True,
                       layer_norm_plus_one=True)

"""Inception's Jais 2 (8B; ``Jais2ForCausalLM``, ``jais2``): Llama's attention with biases (``attention_bias``),
LayerNorms (:mod:`services.engine.model.layernorm_decoder`; ``layer_norm_eps``) and an ungated squared-ReLU MLP with
biases (``mlp_bias``), read as ``Jais2Config`` completes it. Another ``hidden_act`` is refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "jais2"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Jais2Config

    full = with_defaults(ARCHITECTURE, Jais2Config, cfg)
    if full.get("hidden_act") != "relu2":
        raise ModelLoadError(f"jais2: hidden_act {full.get('hidden_act')!r} is not supported (only relu2)")
    fields = base_fields({**full, "rms_norm_eps": full["layer_norm_eps"]}, ARCHITECTURE, check_mlp=False)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, mlp_bias=bool(full.get("mlp_bias")),
                       mlp_activation="relu2", layer_norm=True)

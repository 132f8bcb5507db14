"""AllenAI's OLMo (OLMo-1B-hf, OLMo-7B-hf, OLMo-7B-0424/0724-hf; ``OlmoForCausalLM``, ``olmo``): Llama's layer with
every norm a LayerNorm without a weight or a bias, of epsilon 1e-5 whatever the config says (transformers'
``OlmoLayerNorm``; served by :mod:`services.engine.model.olmo_decoder`), and, where ``clip_qkv`` is set (OLMo 1.7's
8), q, k and v each clamped to ``[-clip_qkv, clip_qkv]`` after their projections (``ModelConfig.clip_qkv``).
``config.json`` is completed with ``OlmoConfig``'s defaults; another ``hidden_act`` is refused by name. OLMo 2 and
3 (``olmo2``, ``olmo3``) are :mod:`services.engine.model.olmo2`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "olmo"
LAYER_NORM_EPS = 1e-5  # OlmoLayerNorm's, fixed


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import OlmoConfig

    full = with_defaults(ARCHITECTURE, OlmoConfig, cfg)
    bias = bool(full.get("attention_bias"))
    clip = full.get("clip_qkv")
    return ModelConfig(**{**base_fields(full, ARCHITECTURE), "rms_norm_eps": LAYER_NORM_EPS}, qkv_bias=bias,
                       o_bias=bias, layer_norm=True, clip_qkv=None if clip is None else float(clip),
                       rope_in_float32=True)

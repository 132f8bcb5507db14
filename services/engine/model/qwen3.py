"""Qwen3 (dense): per-head RMSNorm of q and k before rope, an explicit ``head_dim``, optional attention bias."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_base_fields
from services.engine.model.hf_config import base_fields, qwen_layer_windows

ARCHITECTURE = "qwen3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", False))
    fields = base_fields(cfg, ARCHITECTURE)
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, qk_norm=True,
                       layer_windows=qwen_layer_windows(cfg, fields["max_position"]))


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**gguf_base_fields(fields, ARCHITECTURE), qk_norm=True)

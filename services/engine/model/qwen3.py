"""Qwen3 (dense): per-head RMSNorm of q and k before rope, an explicit ``head_dim``, optional attention bias."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_base_fields
from services.engine.model.hf_config import base_fields, qwen_window

ARCHITECTURE = "qwen3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base_fields(cfg, ARCHITECTURE, window=qwen_window(cfg)), qkv_bias=bias, o_bias=bias,
                       qk_norm=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**gguf_base_fields(fields, ARCHITECTURE), qk_norm=True)

"""Qwen2 / Qwen2.5: Llama with q/k/v biases (a sliding window only where ``use_sliding_window`` is set)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_base_fields
from services.engine.model.hf_config import base_fields, qwen_window

ARCHITECTURE = "qwen2"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**base_fields(cfg, ARCHITECTURE, window=qwen_window(cfg)), qkv_bias=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**gguf_base_fields(fields, ARCHITECTURE), qkv_bias=True)

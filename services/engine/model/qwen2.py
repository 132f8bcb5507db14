"""Qwen2 / Qwen2.5: Llama with q/k/v biases (a sliding window only where ``use_sliding_window`` is set)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_base_fields
from services.engine.model.hf_config import base_fields, qwen_layer_windows

ARCHITECTURE = "qwen2"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = base_fields(cfg, ARCHITECTURE)
    return ModelConfig(**fields, qkv_bias=True, layer_windows=qwen_layer_windows(cfg, fields["max_position"]))


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**gguf_base_fields(fields, ARCHITECTURE), qkv_bias=True)

"""Llama 1/2/3.x (and SmolLM2, TinyLlama, …): the plain decoder; rope scaling llama3, yarn, linear, dynamic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_base_fields
from services.engine.model.hf_config import base_fields

ARCHITECTURE = "llama"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base_fields(cfg, ARCHITECTURE), qkv_bias=bias, o_bias=bias)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**gguf_base_fields(fields, ARCHITECTURE))

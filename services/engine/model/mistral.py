"""Mistral: Llama with an explicit ``head_dim`` and, where ``sliding_window`` is set (Mistral-7B-v0.1: 4096), a
sliding window on every layer, served exactly at any length (later Mistral models have none)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, every_layer_window

ARCHITECTURE = "mistral"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = base_fields(cfg, ARCHITECTURE)
    return ModelConfig(**fields, layer_windows=every_layer_window(cfg, fields["max_position"], default=4096))

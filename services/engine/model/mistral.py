"""Mistral: Llama with an explicit ``head_dim`` and a sliding window, served up to the window (where full
attention equals it; the cap is logged)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields

ARCHITECTURE = "mistral"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    window = cfg.get("sliding_window")
    return ModelConfig(**base_fields(cfg, ARCHITECTURE, window=None if window is None else int(window)))

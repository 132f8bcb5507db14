"""Qwen3-Next (80B-A3B): Qwen3.5-MoE's hybrid layers (:mod:`services.engine.model.qwen3_5`) before Qwen3.5, its
DeltaNet projections stored fused per key head (split at load, :mod:`services.engine.model.hybrid_decoder`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.qwen3_5 import hybrid_config

ARCHITECTURE = "qwen3_next"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hybrid_config(cfg, ARCHITECTURE)

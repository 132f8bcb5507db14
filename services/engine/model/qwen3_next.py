"""Qwen3-Next (80B-A3B): Qwen3.5-MoE's hybrid layers (:mod:`services.engine.model.qwen3_5`) before Qwen3.5, its
DeltaNet projections stored fused per key head (split at load, :mod:`services.engine.model.hybrid_decoder`).

llama.cpp's ``qwen3next`` GGUF files are read as Qwen3.5's (:func:`services.engine.model.qwen3_5.config_from_gguf`;
the converter's transforms undone by :func:`services.engine.model.qwen3_5_gguf.qwen3_next_from_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model import qwen3_5
from services.engine.model.config import ModelConfig
from services.engine.model.qwen3_5 import hybrid_config

ARCHITECTURE = "qwen3_next"
GGUF_ARCHITECTURE = qwen3_5.GGUF_NEXT


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hybrid_config(cfg, ARCHITECTURE)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    return qwen3_5.config_from_gguf(fields)

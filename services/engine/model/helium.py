"""Kyutai's Helium (Helium-1 2B; ``HeliumForCausalLM``, ``helium``): Llama's decoder with rope on pairs of adjacent
dims of the whole head (``rope_interleaved``), q/k/v biases where ``attention_bias`` (never on o_proj), read as
``HeliumConfig`` completes it (a 128-wide head, an RMSNorm epsilon of 1e-8 where unset)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "helium"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import HeliumConfig

    full = with_defaults(ARCHITECTURE, HeliumConfig, cfg)
    return ModelConfig(**base_fields(full, ARCHITECTURE), qkv_bias=bool(full.get("attention_bias")),
                       rope_interleaved=True)

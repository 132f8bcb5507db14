"""IQuest's IQuest-Coder-V1 (7B to 40B; ``iquestcoder``): Llama's decoder under its own model type, read as
transformers reads it (``IQuestCoderConfig``: a 128-wide head where unset; ``clip_qkv`` and sliding windows refused
there, so here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, silu_mlp, with_defaults

ARCHITECTURE = "iquestcoder"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import IQuestCoderConfig

    full = with_defaults(ARCHITECTURE, IQuestCoderConfig, cfg)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**base_fields(full, ARCHITECTURE, check_mlp=False), qkv_bias=bias, o_bias=bias,
                       mlp_bias=silu_mlp(full, ARCHITECTURE))

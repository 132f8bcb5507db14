"""Tencent's Youtu-LLM (2B; ``YoutuForCausalLM``, ``youtu``): Llama's decoder with DeepSeek-V3's multi-head latent
attention (:func:`~services.engine.model.deepseek.latent_config`: q through its low-rank bottleneck, the latent KV,
rope on adjacent pairs where ``rope_interleave``) and a dense SwiGLU MLP on every layer, read as ``YoutuConfig``
completes it (DeepSeek-V3's keys without its experts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.deepseek import latent_config
from services.engine.model.hf_config import with_defaults

ARCHITECTURE = "youtu"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import YoutuConfig

    full = with_defaults(ARCHITECTURE, YoutuConfig, cfg)
    return latent_config(full, ARCHITECTURE, None, interleaved=bool(full.get("rope_interleave", True)))

"""Shanghai AI Lab's InternLM3 (8B; ``InternLM3ForCausalLM``, ``internlm3``): Llama's decoder, read as transformers
reads it (``InternLM3Config``: ``qkv_bias`` and ``bias`` are Llama's ``attention_bias`` and ``mlp_bias``, equal there:
biases on q/k/v/o and the MLP, or none, as released; a 128-wide head where unset; the release's dynamic NTK rope is
plain rope within its context)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, silu_mlp, with_defaults

ARCHITECTURE = "internlm3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import InternLM3Config

    full = with_defaults(ARCHITECTURE, InternLM3Config, cfg)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**base_fields(full, ARCHITECTURE, check_mlp=False), qkv_bias=bias, o_bias=bias,
                       mlp_bias=silu_mlp(full, ARCHITECTURE))

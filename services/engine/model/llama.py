"""Llama 1/2/3.x (and SmolLM2, TinyLlama, …): the plain decoder; rope scaling llama3, yarn, linear, dynamic.
llama.cpp writes Mistral and Mixtral as ``llama`` too: a file with ``llama.expert_count`` is Mixtral's mixture of
experts on every layer, routed as llama.cpp's llama graph routes it (softmax, top-k renormalised)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields
from services.engine.model.hf_config import base_fields
from services.engine.model.mixtral import every_layer_experts

ARCHITECTURE = "llama"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base_fields(cfg, ARCHITECTURE), qkv_bias=bias, o_bias=bias)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    base = gguf_base_fields(fields, ARCHITECTURE)
    f = GGUFFields(fields, ARCHITECTURE)
    experts = int(f.get("expert_count") or 0)
    if not experts:
        return ModelConfig(**base)
    inter = int(f.get("expert_feed_forward_length") or f.key("feed_forward_length"))
    return ModelConfig(**base, moe=every_layer_experts(experts, int(f.key("expert_used_count")), inter,
                                                       base["num_layers"]))

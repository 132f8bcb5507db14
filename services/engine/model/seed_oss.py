"""ByteDance's Seed-OSS (36B; ``SeedOssForCausalLM``, ``seed_oss``): Llama's decoder with q/k/v biases
(``attention_bias``, on by default) and an o_proj bias where ``attention_out_bias`` says so, an explicit
``head_dim`` (128 where absent, as ``SeedOssConfig`` has it). ``mlp_bias`` is refused (the shared MLP has none).

llama.cpp's ``seed_oss`` GGUF files (:func:`config_from_gguf`) hold the layer unpermuted (NEOX's rope, on halves), the
norm before the MLP as ``post_attention_norm``; the biases are those the file holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields

ARCHITECTURE = GGUF_ARCHITECTURE = "seed_oss"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    absent_head_dim = "head_dim" not in cfg  # SeedOssConfig's 128; an explicit null is hidden / heads, as there
    cfg = {"attention_bias": True, "attention_out_bias": False, **{k: v for k, v in cfg.items() if v is not None}}
    if absent_head_dim:
        cfg["head_dim"] = 128
    return ModelConfig(**base_fields(cfg, ARCHITECTURE), qkv_bias=bool(cfg["attention_bias"]),
                       o_bias=bool(cfg["attention_out_bias"]))


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    base, f = gguf_base_fields(fields, GGUF_ARCHITECTURE), GGUFFields(fields, GGUF_ARCHITECTURE)
    return ModelConfig(**{**base, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       qkv_bias=f.has_tensor(".attn_q.bias"), o_bias=f.has_tensor(".attn_output.bias"))

"""Qwen3-MoE: Qwen3's attention with a sparse mixture of experts (top-k routing, ``norm_topk_prob``) in the
layers ``decoder_sparse_step`` picks and ``mlp_only_layers`` does not exclude."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields
from services.engine.model.hf_config import base_fields, every_layer_window, required

ARCHITECTURE = "qwen3_moe"
GGUF_ARCHITECTURE = "qwen3moe"


def sparse_layers(num_layers: int, step: int, dense_only: list[int]) -> tuple[int, ...]:
    return tuple(i for i in range(num_layers) if i not in dense_only and step > 0 and (i + 1) % step == 0)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = base_fields(cfg, ARCHITECTURE)
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or required(cfg, "num_experts"))
    moe = MoEConfig(
        num_experts=experts, top_k=int(required(cfg, "num_experts_per_tok")),
        intermediate_size=int(required(cfg, "moe_intermediate_size")),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_layers=sparse_layers(fields["num_layers"], int(cfg.get("decoder_sparse_step", 1)),
                                    list(cfg.get("mlp_only_layers") or [])),
    )
    bias = bool(cfg.get("attention_bias", False))
    # transformers' Qwen3-MoE: with use_sliding_window, the window (4096 when absent) holds on every layer
    windows = every_layer_window(cfg, fields["max_position"], 4096) if cfg.get("use_sliding_window") else ()
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, qk_norm=True, moe=moe, layer_windows=windows)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    moe = MoEConfig(
        num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
        intermediate_size=int(f.key("expert_feed_forward_length")),
        norm_topk_prob=bool(f.get("expert_weights_norm", True)),
        sparse_layers=tuple(range(base["num_layers"])),
    )
    return ModelConfig(**{**base, "architecture": ARCHITECTURE}, qk_norm=True, moe=moe)

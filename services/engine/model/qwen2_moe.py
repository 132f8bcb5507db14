"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with a sparse mixture of
experts in the layers ``decoder_sparse_step`` picks and ``mlp_only_layers`` does not exclude, each beside a
shared expert that every token goes through, scaled by the sigmoid of its own gate (``shared_expert_gate``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields
from services.engine.model.hf_config import base_fields, required
from services.engine.model.qwen3_moe import sparse_layers

ARCHITECTURE = "qwen2_moe"
GGUF_ARCHITECTURE = "qwen2moe"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    if cfg.get("use_sliding_window"):  # no release sets it; transformers' layer pattern for it is its own
        raise ModelLoadError("qwen2_moe: use_sliding_window is not supported")
    fields = base_fields(cfg, ARCHITECTURE)
    moe = MoEConfig(
        num_experts=int(required(cfg, "num_experts")), top_k=int(required(cfg, "num_experts_per_tok")),
        intermediate_size=int(required(cfg, "moe_intermediate_size")),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_layers=sparse_layers(fields["num_layers"], int(cfg.get("decoder_sparse_step", 1)),
                                    list(cfg.get("mlp_only_layers") or [])),
        shared_expert_intermediate_size=int(required(cfg, "shared_expert_intermediate_size")),
    )
    return ModelConfig(**fields, qkv_bias=bool(cfg.get("qkv_bias", True)), moe=moe)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """As llama.cpp's ``qwen2moe`` reads it: experts on every layer, the router's softmax not renormalised,
    the shared expert ``expert_shared_feed_forward_length`` wide (q/k/v biases: from the tensors). Files converted
    before those keys existed (early Qwen1.5-MoE ones) get llama.cpp's fallbacks: an expert
    ``feed_forward_length / expert_used_count`` wide, the shared one ``feed_forward_length``."""
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    top_k = int(f.key("expert_used_count"))
    expert = f.get("expert_feed_forward_length") or int(f.key("feed_forward_length")) // top_k
    shared = f.get("expert_shared_feed_forward_length") or f.key("feed_forward_length")
    moe = MoEConfig(
        num_experts=int(f.key("expert_count")), top_k=top_k, intermediate_size=int(expert), norm_topk_prob=False,
        sparse_layers=tuple(range(base["num_layers"])), shared_expert_intermediate_size=int(shared),
    )
    return ModelConfig(**{**base, "architecture": ARCHITECTURE}, moe=moe)

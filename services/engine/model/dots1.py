"""rednote's dots.llm1 (``Dots1ForCausalLM``, ``dots1``; 142B-A14B, base and instruct): Qwen3's attention (per-head q/k
RMSNorms before rope, biases with ``attention_bias``) with DeepSeek-V3's experts after the first
``first_k_dense_replace`` dense layers: the sigmoid of float32 router logits chosen with the correction bias among the
``topk_group`` best of ``n_group`` groups, renormalised where ``norm_topk_prob``, times ``routed_scaling_factor``,
beside ``n_shared_experts`` ungated shared experts (read as GLM-4.5's). Sliding windows on the layers ``layer_types``
names (by default those from ``max_window_layers`` on: none in the releases). ``config.json`` is completed with
transformers' ``Dots1Config``, whose router is DeepSeek-V3's whatever ``scoring_func`` a file writes. llama.cpp's
``dots1`` GGUF files too (:func:`config_from_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.deepseek import sparse_mlp
from services.engine.model.gguf_config import (
    SIGMOID_GATING,
    GGUFFields,
    gguf_base_fields,
    gguf_turn_end_ids,
    require_gating,
)
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = GGUF_ARCHITECTURE = "dots1"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Dots1Config

    full = with_defaults(ARCHITECTURE, Dots1Config, cfg)
    fields = base_fields(full, ARCHITECTURE)
    layers = fields["num_layers"]
    windows = typed_layer_windows(ARCHITECTURE, list(full["layer_types"]), layers, full.get("sliding_window"))
    moe = sparse_mlp(full, tuple(range(int(full.get("first_k_dense_replace") or 0), layers)), sigmoid_routing=True,
                     expert_groups=int(full.get("n_group") or 1), top_groups=int(full.get("topk_group") or 1))
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qk_norm=True, qkv_bias=bias, o_bias=bias, moe=moe,
                       layer_windows=windows if any(w is not None for w in windows) else ())


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``dots1`` file's config, as its loader reads it: its Qwen2-MoE converter's expert keys with the
    sigmoid gating (another refused), ``leading_dense_block_count`` dense layers, the shared experts
    ``expert_shared_count`` of the experts' width, the correction bias as ``exp_probs_b``; q/k norms; nothing
    permuted."""
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    require_gating(f, SIGMOID_GATING, "dots.llm1")
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    layers = base["num_layers"]
    width = int(f.key("expert_feed_forward_length"))
    moe = MoEConfig(num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
                    intermediate_size=width, norm_topk_prob=bool(f.get("expert_weights_norm")),
                    sparse_layers=tuple(range(int(f.get("leading_dense_block_count") or 0), layers)),
                    shared_expert_intermediate_size=width * int(f.get("expert_shared_count") or 0) or None,
                    shared_expert_gated=False, sigmoid_routing=True,
                    expert_groups=int(f.get("expert_group_count") or 1),
                    top_groups=int(f.get("expert_group_used_count") or 1),
                    routed_scaling=f.decimal("expert_weights_scale", 1.0))
    head_dim = int(f.get("attention.key_length") or base["hidden_size"] // base["num_heads"])
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "head_dim": head_dim,
                          "eos_token_ids": gguf_turn_end_ids(base, fields)}, qk_norm=True, moe=moe)

"""rednote's dots.llm1 (``Dots1ForCausalLM``, ``dots1``; 142B-A14B, base and instruct): Qwen3's attention (per-head q/k
RMSNorms before rope, biases with ``attention_bias``) with DeepSeek-V3's experts after the first
``first_k_dense_replace`` dense layers: the sigmoid of float32 router logits chosen with the correction bias among
the ``topk_group`` best of ``n_group`` groups, renormalised where ``norm_topk_prob``, times ``routed_scaling_factor``,
beside ``n_shared_experts`` ungated shared experts (read as GLM-4.5's). Sliding windows on the layers ``layer_types``
names (by default those from ``max_window_layers`` on: none in the releases). ``config.json`` is completed with
transformers' ``Dots1Config``, whose router is DeepSeek-V3's whatever ``scoring_func`` a file writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.deepseek import sparse_mlp
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "dots1"


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

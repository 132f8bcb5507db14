"""JetBrains' Mellum 2 (12B-A2.5B; ``MellumForCausalLM``, ``mellum``): Qwen3-MoE's attention (per-head q/k norms) and
experts (the softmax over all, its top-k, ``norm_topk_prob``) on the layers ``mlp_layer_types`` names sparse (dense
MLPs elsewhere), with sliding layers (``layer_types``, ``sliding_window``) that rotate with their own plain rope
beside the full layers' (``rope_parameters`` per layer kind: ``ModelConfig.local_rope_layers``, the shared decoder's
:mod:`~services.engine.model.typed_ropes`), read as ``MellumConfig`` completes it. A sliding layers' rope with
scaling or a partial rotation (transformers' Mellum rotates whole heads) is refused by name. Its
multi-token-prediction weights (``mtp.*``) are not read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig, windowed_layers
from services.engine.model.hf_config import (
    sparse_mlp_layers,
    typed_layer_windows,
    typed_ropes,
    with_defaults,
)
from services.engine.model.tensor_renames import is_mtp_weight

ARCHITECTURE = "mellum"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import MellumConfig

    full = with_defaults(ARCHITECTURE, MellumConfig, cfg)
    fields, local_theta = typed_ropes(full, ARCHITECTURE)  # (whole heads rotate: a partial rotation refused)
    layers = fields["num_layers"]
    windows = typed_layer_windows(ARCHITECTURE, list(full["layer_types"]), layers, full.get("sliding_window"))
    local = windowed_layers(windows)
    moe = MoEConfig(num_experts=int(full["num_local_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=int(full["moe_intermediate_size"]),
                    norm_topk_prob=bool(full["norm_topk_prob"]),
                    sparse_layers=sparse_mlp_layers(full, layers, ARCHITECTURE))
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qk_norm=True, qkv_bias=bias, o_bias=bias, moe=moe if moe.sparse_layers else None,
                       layer_windows=windows if local else (), local_rope_layers=local,
                       local_rope_theta=local_theta if local else None)


def mellum_tensor_name(name: str) -> str | None:
    """A Mellum checkpoint tensor's name in the shared decoder; None for the multi-token-prediction weights."""
    return None if is_mtp_weight(name) else name

"""GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7 (``Glm4MoeForCausalLM``, ``glm4_moe``): Llama's decoder with q/k/v
biases (``attention_bias``), per-head q/k RMSNorms where ``use_qk_norm`` (GLM-4.5 and 4.6; not Air), rope on the
first half of each head (``partial_rotary_factor``, 0.5 where absent, as ``Glm4MoeConfig`` reads it), dense MLPs
on the first ``first_k_dense_replace`` layers and experts on the rest:

- routing by the sigmoid of float32 router logits: each token's ``num_experts_per_tok`` experts are those of
  highest score plus ``e_score_correction_bias``, among the ``topk_group`` best of ``n_group`` groups; their
  weights are the scores alone, renormalised (``norm_topk_prob``) and times ``routed_scaling_factor``
  (:attr:`~services.engine.model.config.MoEConfig.sigmoid_routing`);
- ``n_shared_experts`` shared experts as one SwiGLU MLP (``moe_intermediate_size * n_shared_experts`` wide) that
  every token goes through, ungated (``mlp.shared_experts``, read as the shared decoder's ``mlp.shared_expert``).

Upstage's Solar Open (100B; ``solar_open``) is the same MoE under Llama's attention: no q/k norms, the whole head
rotated (unless its rope parameters say otherwise), experts on every layer, 1280 wide where unset.

The checkpoints carry ``num_nextn_predict_layers`` multi-token-prediction layers after the last decoder layer
(``model.layers.46.*`` in Air's): they serve speculative decoding, which pdserve does not run, so they are not
read (:attr:`~services.engine.model.registry.Family.mtp_layers`).

llama.cpp's ``glm4moe`` GGUF files (:func:`config_from_gguf`) hold the same model: the head from
``attention.key_length`` (else hidden / heads), its rotated part ``rope.dimension_count``; q/k norms where the file
has ``attn_q_norm``; the router's correction bias as ``exp_probs_b.bias``, the norm before the MLP as
``post_attention_norm``; the prediction layers as the last ``nextn_predict_layers`` blocks (not read); nothing
permuted (GLM's rope is NeoX's, as llama.cpp's graph runs it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import (
    SIGMOID_GATING,
    GGUFFields,
    gguf_base_fields,
    gguf_turn_end_ids,
    require_gating,
)
from services.engine.model.hf_config import base_fields, required, with_defaults

ARCHITECTURE = "glm4_moe"
SOLAR_OPEN = "solar_open"
GGUF_ARCHITECTURE = "glm4moe"

_SHARED = re.compile(r"\.mlp\.shared_experts\.")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    if cfg.get("model_type") == SOLAR_OPEN:
        return _solar_open(cfg)
    cfg = {"partial_rotary_factor": 0.5, **cfg}  # Glm4MoeConfig's default
    fields = base_fields(cfg, ARCHITECTURE, partial_rotary=True)
    moe = glm_experts(cfg, range(int(cfg.get("first_k_dense_replace", 1)), fields["num_layers"]))
    return ModelConfig(**{**fields, "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-5))},
                       qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=bool(cfg.get("use_qk_norm", False)),
                       moe=moe)


def _solar_open(cfg: Mapping[str, Any]) -> ModelConfig:
    """Solar Open's config, completed with ``SolarOpenConfig``'s defaults (which has no ``first_k_dense_replace``,
    ``use_qk_norm`` nor dense MLP: experts on every layer; a partial rotary factor is refused by name, as
    transformers' Solar Open rotates whole heads)."""
    from transformers import SolarOpenConfig

    full = with_defaults(SOLAR_OPEN, SolarOpenConfig, cfg)
    width = int(full["moe_intermediate_size"])
    fields = base_fields({**full, "intermediate_size": width}, SOLAR_OPEN)  # (no dense MLP: the width unused)
    return ModelConfig(**{**fields, "architecture": ARCHITECTURE}, qkv_bias=bool(full.get("attention_bias")),
                       moe=glm_experts(full, range(fields["num_layers"])))


def glm_experts(cfg: Mapping[str, Any], sparse_layers: range) -> MoEConfig:
    """GLM-4.5's experts (and Solar Open's) on ``sparse_layers``: sigmoid-routed within the best groups, beside
    ``n_shared_experts`` ungated shared ones."""
    expert_width = int(cfg.get("moe_intermediate_size", 1408))
    return MoEConfig(
        num_experts=int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 128),
        top_k=int(required(cfg, "num_experts_per_tok")), intermediate_size=expert_width,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)), sparse_layers=tuple(sparse_layers),
        shared_expert_intermediate_size=expert_width * int(cfg.get("n_shared_experts", 1)) or None,
        shared_expert_gated=False, sigmoid_routing=True, expert_groups=int(cfg.get("n_group", 1)),
        top_groups=int(cfg.get("topk_group", 1)), routed_scaling=float(cfg.get("routed_scaling_factor", 1.0)),
    )


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    require_gating(f, SIGMOID_GATING, "GLM-4.5")
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    layers = base["num_layers"] - int(f.get("nextn_predict_layers") or 0)
    head_dim = int(f.get("attention.key_length") or base["hidden_size"] // base["num_heads"])
    rotary = int(f.key("rope.dimension_count"))
    expert_width = int(f.key("expert_feed_forward_length"))
    moe = MoEConfig(
        num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")), intermediate_size=expert_width,
        norm_topk_prob=bool(f.get("expert_weights_norm")),
        sparse_layers=tuple(range(int(f.get("leading_dense_block_count") or 0), layers)),
        shared_expert_intermediate_size=expert_width * int(f.get("expert_shared_count") or 0) or None,
        shared_expert_gated=False, sigmoid_routing=True, expert_groups=int(f.get("expert_group_count") or 1),
        top_groups=int(f.get("expert_group_used_count") or 1),
        routed_scaling=f.decimal("expert_weights_scale", 1.0),
    )
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "num_layers": layers, "head_dim": head_dim,
                          "rotary_dim": None if rotary == head_dim else rotary,
                          "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       qk_norm=f.has_tensor(".attn_q_norm.weight"), moe=moe)


def glm4_moe_tensor_name(name: str) -> str:
    """A GLM-4.5 checkpoint tensor's name in the shared decoder (its shared experts are the decoder's shared
    expert)."""
    return _SHARED.sub(".mlp.shared_expert.", name)

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

The checkpoints carry ``num_nextn_predict_layers`` multi-token-prediction layers after the last decoder layer
(``model.layers.46.*`` in Air's): they serve speculative decoding, which pdserve does not run, so they are not
read (:attr:`~services.engine.model.registry.Family.mtp_layers`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.hf_config import base_fields, required

ARCHITECTURE = "glm4_moe"

_SHARED = re.compile(r"\.mlp\.shared_experts\.")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"partial_rotary_factor": 0.5, **cfg}  # Glm4MoeConfig's default
    fields = base_fields(cfg, ARCHITECTURE, partial_rotary=True)
    layers = fields["num_layers"]
    expert_width = int(cfg.get("moe_intermediate_size", 1408))
    moe = MoEConfig(
        num_experts=int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 128),
        top_k=int(required(cfg, "num_experts_per_tok")), intermediate_size=expert_width,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        sparse_layers=tuple(range(int(cfg.get("first_k_dense_replace", 1)), layers)),
        shared_expert_intermediate_size=expert_width * int(cfg.get("n_shared_experts", 1)) or None,
        shared_expert_gated=False, sigmoid_routing=True, expert_groups=int(cfg.get("n_group", 1)),
        top_groups=int(cfg.get("topk_group", 1)), routed_scaling=float(cfg.get("routed_scaling_factor", 1.0)),
    )
    return ModelConfig(**{**fields, "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-5))},
                       qkv_bias=bool(cfg.get("attention_bias", False)), qk_norm=bool(cfg.get("use_qk_norm", False)),
                       moe=moe)


def glm4_moe_tensor_name(name: str) -> str:
    """A GLM-4.5 checkpoint tensor's name in the shared decoder (its shared experts are the decoder's shared
    expert)."""
    return _SHARED.sub(".mlp.shared_expert.", name)

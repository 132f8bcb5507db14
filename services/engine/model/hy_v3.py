"""Tencent's Hy3 (``HYV3ForCausalLM``, ``hy_v3``; Hy3-preview): Llama's layer with per-head q/k RMSNorms before rope
(Qwen3's), a dense first MLP and experts on the layers ``mlp_layer_types`` calls sparse:

- routing by the sigmoid of float32 router logits: each token's ``num_experts_per_tok`` experts are those of highest
  score plus the correction bias, no groups; their weights the scores alone, renormalised and times
  ``router_scaling_factor`` (:attr:`~services.engine.model.config.MoEConfig.sigmoid_routing`, GLM-4.5's with one
  group);
- ``num_shared_experts`` shared experts as one ungated SwiGLU MLP ``moe_intermediate_size * num_shared_experts`` wide;
  ``enable_moe_fp32_combine`` adds it to the routed sum in float32, which rounds as the serving dtype's own addition
  does (one correctly rounded sum), so nothing changes.

The checkpoints name the router ``mlp.router.gate``, its correction bias ``mlp.expert_bias`` and the shared MLP
``mlp.shared_mlp`` (read as the shared decoder's ``mlp.gate``, ``mlp.gate.e_score_correction_bias`` and
``mlp.shared_expert``); the multi-token-prediction layer after the last (``model.layers.80.*``) is not read.
``config.json`` is completed with transformers' ``HYV3Config`` defaults. Refused by name: ``attention_bias``,
``mlp_bias`` (no release has them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.hf_config import base_fields, sparse_mlp_layers, with_defaults

ARCHITECTURE = "hy_v3"

_NAMES = ((re.compile(r"\.mlp\.router\.gate\."), ".mlp.gate."),
          (re.compile(r"\.mlp\.expert_bias$"), ".mlp.gate.e_score_correction_bias"),
          (re.compile(r"\.mlp\.shared_mlp\."), ".mlp.shared_expert."))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import HYV3Config

    full = with_defaults(ARCHITECTURE, HYV3Config, cfg)
    for key in ("attention_bias", "mlp_bias"):
        if full.get(key):
            raise ModelLoadError(f"{ARCHITECTURE}: {key} is not supported (no released checkpoint has it)")
    fields = base_fields(full, ARCHITECTURE)
    width = int(full["moe_intermediate_size"])
    moe = MoEConfig(num_experts=int(full["num_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=width, norm_topk_prob=True,
                    sparse_layers=sparse_mlp_layers(full, fields["num_layers"], ARCHITECTURE),
                    shared_expert_intermediate_size=width * int(full.get("num_shared_experts") or 0) or None,
                    shared_expert_gated=False, sigmoid_routing=True,
                    routed_scaling=float(full["router_scaling_factor"]))
    return ModelConfig(**fields, qk_norm=True, moe=moe)


def hy_v3_tensor_name(name: str) -> str:
    """A Hy3 checkpoint tensor's name in the shared decoder (the router, its correction bias and the shared MLP
    under the decoder's names)."""
    for pattern, replacement in _NAMES:
        name = pattern.sub(replacement, name)
    return name

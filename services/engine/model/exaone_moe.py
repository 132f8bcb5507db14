"""LG AI Research's K-EXAONE (236B-A23B; ``ExaoneMoeForCausalLM``, ``exaone_moe``): EXAONE 4.0's attention (per-head
q/k norms; sliding layers with rope, global ones without: :func:`~services.engine.model.exaone4.exaone4_layers`) in a
pre-norm layer (OLMoE's, as the shared decoder's), with DeepSeek-V3's experts where ``mlp_layer_types`` says sparse
(sigmoid routing with a correction bias among the ``topk_group`` best of ``n_group`` groups, times
``routed_scaling_factor``, beside ``num_shared_experts`` ungated shared experts; dense MLPs elsewhere), read as
``ExaoneMoeConfig`` completes it. Its multi-token-prediction weights (``mtp.*``) are not read."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.deepseek import sparse_mlp
from services.engine.model.exaone4 import exaone4_layers
from services.engine.model.glm4_moe import glm4_moe_tensor_name
from services.engine.model.hf_config import base_fields, sparse_mlp_layers, with_defaults
from services.engine.model.tensor_renames import is_mtp_weight

ARCHITECTURE = "exaone_moe"

_CORRECTION_BIAS = re.compile(r"\.mlp\.e_score_correction_bias$")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import ExaoneMoeConfig

    full = with_defaults(ARCHITECTURE, ExaoneMoeConfig, cfg)
    fields = base_fields(full, ARCHITECTURE)
    layers = fields["num_layers"]
    moe = sparse_mlp({**full, "n_routed_experts": full["num_experts"], "n_shared_experts": full["num_shared_experts"]},
                     sparse_mlp_layers(full, layers, ARCHITECTURE), sigmoid_routing=True,
                     expert_groups=int(full["n_group"]), top_groups=int(full["topk_group"]))
    return ModelConfig(**fields, qk_norm=True, moe=moe, **exaone4_layers(full, ARCHITECTURE, layers))


def exaone_moe_tensor_name(name: str) -> str | None:
    """A K-EXAONE checkpoint tensor's name in the shared decoder (the router's correction bias, stored beside the
    router as ``mlp.e_score_correction_bias``, under it; its shared experts the decoder's shared expert); None for
    the multi-token-prediction weights."""
    if is_mtp_weight(name):
        return None
    return glm4_moe_tensor_name(_CORRECTION_BIAS.sub(".mlp.gate.e_score_correction_bias", name))

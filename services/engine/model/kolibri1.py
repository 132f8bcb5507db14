"""Aleph Alpha's Kolibri-1 (``Kolibri1ForCausalLM``, ``kolibri1``): EXAONE 4.0's attention (per-head q/k norms; the
layers ``layer_types`` names sliding attend within ``sliding_window`` with rope, the others over everything without:
:func:`~services.engine.model.exaone4.exaone4_layers`) in GLM-4's layer (a norm on each block's output too:
``sandwich_norms``), experts on every layer beside an ungated shared one (``shared_expert_intermediate_size``), routed
by the sigmoid of float32 logits chosen by the logits plus a correction bias (``MoEConfig.choice_on_logits``),
renormalised where ``norm_topk_prob``; read as ``Kolibri1Config`` completes it. Its released names
(``moe.router.expert_bias``, ``post_attn_norm``, ``post_ffn_norm``) are read as transformers' conversion map reads
them (:func:`kolibri1_tensor_name`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.exaone4 import exaone4_layers
from services.engine.model.glm4_moe import glm4_moe_tensor_name
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = "kolibri1"

_NAMES = renames((
    (r"\.moe\.router\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.post_attn_norm\.", ".post_self_attn_layernorm."), (r"\.post_ffn_norm\.", ".post_mlp_layernorm."),
))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Kolibri1Config

    full = with_defaults(ARCHITECTURE, Kolibri1Config, cfg)
    width = int(full["moe_intermediate_size"])
    fields = base_fields({**full, "intermediate_size": width}, ARCHITECTURE)  # (no dense MLP: the width unused)
    layers = fields["num_layers"]
    moe = MoEConfig(num_experts=int(full["num_local_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=width, norm_topk_prob=bool(full["norm_topk_prob"]),
                    sparse_layers=tuple(range(layers)),
                    shared_expert_intermediate_size=int(full["shared_expert_intermediate_size"]) or None,
                    shared_expert_gated=False, sigmoid_routing=True, choice_on_logits=True)
    return ModelConfig(**fields, qk_norm=True, sandwich_norms=True, moe=moe,
                       **exaone4_layers(full, ARCHITECTURE, layers))


def kolibri1_tensor_name(name: str) -> str:
    """A Kolibri-1 checkpoint tensor's name in the shared decoder."""
    return glm4_moe_tensor_name(renamed(name, _NAMES))

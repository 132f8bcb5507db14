"""Sarvam AI's models, which transformers serves with other families' classes.

- Sarvam-105B (``sarvam_mla``): DeepSeek-V3's model (latent attention, one q projection where ``q_lora_rank`` is
  null; sigmoid routing, by default over one group, after one dense layer), its config read by
  ``SarvamMLAConfig`` (which turns the releases' legacy ``head_dim`` and ``deepseek_yarn`` rope into DeepSeek-V3's
  keys): :func:`sarvam_mla_as_deepseek_v3`, served by :mod:`services.engine.model.deepseek`.
- Sarvam-30B (``sarvam_moe``, :func:`config_from_hf`): GLM-4.5's model (per-head q/k norms, q/k/v biases where
  ``use_qkv_bias``, the whole head rotated unless ``partial_rotary_factor`` says otherwise, sigmoid-routed experts
  with a correction bias beside ungated shared ones after ``first_k_dense_replace`` dense layers) under Bailing-MoE's
  names: ``word_embeddings``, ``attention.query_key_value`` (q, k, v rows stacked, read fused), ``attention.dense``,
  ``query_layernorm``/``key_layernorm``, the router's ``expert_bias`` (:func:`sarvam_moe_tensor_name`, as
  transformers' conversion map reads them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.glm4_moe import glm4_moe_tensor_name, glm_experts
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.tensor_renames import renamed, renames

SARVAM_MLA = "sarvam_mla"
ARCHITECTURE = "sarvam_moe"

_MOE_NAMES = renames((
    (r"^model\.word_embeddings\.", "model.embed_tokens."), (r"\.attention\.", ".self_attn."),
    (r"\.self_attn\.query_key_value\.", ".self_attn.qkv_proj."), (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
    (r"\.self_attn\.query_layernorm\.", ".self_attn.q_norm."), (r"\.self_attn\.key_layernorm\.", ".self_attn.k_norm."),
    (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
))


def sarvam_mla_as_deepseek_v3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A ``sarvam_mla`` config as the DeepSeek-V3 config it is (``SarvamMLAConfig``'s defaults and conversions)."""
    from transformers import SarvamMLAConfig

    return {**with_defaults(SARVAM_MLA, SarvamMLAConfig, cfg), "model_type": "deepseek_v3"}


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import SarvamMoEConfig

    full = with_defaults(ARCHITECTURE, SarvamMoEConfig, cfg)
    fields = base_fields(full, ARCHITECTURE, partial_rotary=True)
    moe = glm_experts(full, range(int(full["first_k_dense_replace"]), fields["num_layers"]))
    return ModelConfig(**fields, qkv_bias=bool(full.get("attention_bias")), qk_norm=bool(full.get("use_qk_norm")),
                       moe=moe)


def sarvam_moe_tensor_name(name: str) -> str:
    """A Sarvam-30B checkpoint tensor's name in the shared decoder."""
    return glm4_moe_tensor_name(renamed(name, _MOE_NAMES))

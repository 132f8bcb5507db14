"""inclusionAI's Ling 3 hybrids (Ling-3.0-Flash; ``BailingHybridForCausalLM``, ``bailing_hybrid``): Kimi Linear's
layer mix (:mod:`services.engine.model.kimi_linear_decoder`: Kimi Delta Attention in ``layer_group_size - 1`` layers
of each group, latent attention in its last) with

- KDA's forget and output gates projected at full width (``f_proj``, ``g_proj``: ``LinearAttention.full_rank_gates``)
  and, with ``kda_safe_gate``, its log decay bounded, ``kda_lower_bound · sigmoid(exp(A_log) · x)``
  (``LinearAttention.decay_bound``);
- latent attention rotated on adjacent pairs (``rope_theta`` 6M), each head's values gated by the sigmoid of its row
  of ``g_proj`` (``attention_head_gate``);
- DeepSeek-V3's experts from ``first_k_dense_replace`` on (``mlp_layer_types``), the multi-token-prediction layers
  after the last not read.

``config.json`` is completed with ``BailingHybridConfig``'s defaults; the released names (``word_embeddings``,
``attention``, its ``dense`` output, the router's ``expert_bias``, q/k/v convolutions apart) are read as they are
(:func:`bailing_hybrid_tensor_name`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import LinearAttention, ModelConfig
from services.engine.model.deepseek import latent_config
from services.engine.model.glm4_moe import glm4_moe_tensor_name
from services.engine.model.hf_config import with_defaults
from services.engine.model.kimi_linear import kda_hybrid_parts

ARCHITECTURE = "bailing_hybrid"
_RENAMES = ((re.compile(r"^model\.word_embeddings\."), "model.embed_tokens."),
            (re.compile(r"\.attention\."), ".self_attn."), (re.compile(r"\.self_attn\.dense\."), ".self_attn.o_proj."),
            (re.compile(r"\.mlp\.gate\.expert_bias$"), ".mlp.gate.e_score_correction_bias"))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import BailingHybridConfig

    full = with_defaults(ARCHITECTURE, BailingHybridConfig, cfg)
    kinds, moe = kda_hybrid_parts(full, ARCHITECTURE)
    heads, width = int(full["num_attention_heads"]), int(full["head_dim"])
    kda = LinearAttention(layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
                          key_heads=heads, value_heads=heads, key_head_dim=width, value_head_dim=width,
                          conv_kernel=int(full["short_conv_kernel_size"]), channel_decay=True, full_rank_gates=True,
                          float32_mixer=True,
                          decay_bound=float(full["kda_lower_bound"]) if full.get("kda_safe_gate") else None)
    config = latent_config(full, ARCHITECTURE, moe, interleaved=True)
    return dataclasses.replace(config, linear_attention=kda, attention_head_gate=True)


def bailing_hybrid_tensor_name(name: str) -> str:
    """A released tensor's name in the decoder (see the module); the shared experts as the decoder's shared expert."""
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return glm4_moe_tensor_name(name)

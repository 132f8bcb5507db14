"""AllenAI's FlexOlmo (7x7B; ``FlexOlmoForCausalLM``, ``flex_olmo``): OLMo 2's layer
(:mod:`services.engine.model.olmo2_decoder`: a norm on each block's output only, q and k normed over all their heads)
with OLMoE's experts as its MLP on every layer (:func:`~services.engine.model.olmoe.olmoe_experts`: the softmax of the
router's logits, its top-k, not renormalised unless ``norm_topk_prob``), read as ``FlexOlmoConfig`` completes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.olmoe import olmoe_experts

ARCHITECTURE = "flex_olmo"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import FlexOlmoConfig

    full = with_defaults(ARCHITECTURE, FlexOlmoConfig, cfg)
    fields = base_fields(full, ARCHITECTURE)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, rope_in_float32=True,
                       moe=olmoe_experts(full, fields["intermediate_size"], fields["num_layers"]))

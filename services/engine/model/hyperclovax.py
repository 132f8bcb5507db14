"""NAVER's HyperCLOVA X SEED Think (14B; ``HyperCLOVAXForCausalLM``, ``hyperclovax``): IBM Granite's decoder (its four
scalars: :mod:`services.engine.model.granite`) with a norm on each block's output before the residual multiplier
(``use_post_norm``: the shared decoder's ``sandwich_norms``, read from ``post_norm1``/``post_norm2``,
:func:`hyperclovax_tensor_name`), read as ``HyperCLOVAXConfig`` completes it (the attention's multiplier
``head_dim ** -0.5`` where unset)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, Multipliers
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "hyperclovax"

_POST_NORMS = ((re.compile(r"\.post_norm1\."), ".post_self_attn_layernorm."),
               (re.compile(r"\.post_norm2\."), ".post_mlp_layernorm."))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import HyperCLOVAXConfig

    full = with_defaults(ARCHITECTURE, HyperCLOVAXConfig, cfg)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**base_fields(full, ARCHITECTURE), qkv_bias=bias, o_bias=bias,
                       sandwich_norms=bool(full.get("use_post_norm")), multipliers=Multipliers(
                           embedding=float(full["embedding_multiplier"]),
                           attention=float(full["attention_multiplier"]),
                           residual=float(full["residual_multiplier"]),
                           logits_divisor=float(full["logits_scaling"])))


def hyperclovax_tensor_name(name: str) -> str:
    """A HyperCLOVA X checkpoint tensor's name in the shared decoder (its block-output norms as GLM-4 names them)."""
    for pattern, replacement in _POST_NORMS:
        name = pattern.sub(replacement, name)
    return name

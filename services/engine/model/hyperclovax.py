"""NAVER's HyperCLOVA X SEED Think (14B; ``HyperCLOVAXForCausalLM``, ``hyperclovax``): IBM Granite's decoder with
its embedding, attention and residual scalars (:func:`~services.engine.model.granite.multipliers`) but the logits
*multiplied* by ``logits_scaling`` (muP; Granite divides), a norm on each block's output before the residual multiplier
(``use_post_norm``: the shared decoder's ``sandwich_norms``, read from ``post_norm1``/``post_norm2``,
:func:`hyperclovax_tensor_name`), biases where ``attention_bias`` and ``mlp_bias`` say, read as ``HyperCLOVAXConfig``
completes it (the attention's multiplier ``head_dim ** -0.5`` where unset)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.granite import multipliers
from services.engine.model.hf_config import base_fields, silu_mlp, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = "hyperclovax"

_POST_NORMS = renames(((r"\.post_norm1\.", ".post_self_attn_layernorm."), (r"\.post_norm2\.", ".post_mlp_layernorm.")))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import HyperCLOVAXConfig

    full = with_defaults(ARCHITECTURE, HyperCLOVAXConfig, cfg)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**base_fields(full, ARCHITECTURE, check_mlp=False), qkv_bias=bias, o_bias=bias,
                       mlp_bias=silu_mlp(full, ARCHITECTURE), sandwich_norms=bool(full.get("use_post_norm")),
                       multipliers=multipliers(full, logits_multiplied=True))


def hyperclovax_tensor_name(name: str) -> str:
    """A HyperCLOVA X checkpoint tensor's name in the shared decoder (its block-output norms as GLM-4 names them)."""
    return renamed(name, _POST_NORMS)

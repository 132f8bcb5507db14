"""LG's EXAONE 3.0 and 3.5 (2.4B, 7.8B, 32B) and EXAONE Deep (``ExaoneForCausalLM``, ``exaone``): Llama's decoder
(3.5's llama3 rope scaling; the 2.4B's tied head) under GPT-2-style names: ``transformer.wte``, ``transformer.h.{i}``
with ``ln_1``/``ln_2``, ``attn.attention.{q,k,v}_proj`` and ``out_proj``, ``mlp.c_fc_0``/``c_fc_1``/``c_proj``,
``transformer.ln_f`` (read under Llama's, as transformers' conversion map reads them). ``config.json`` is completed
with transformers' ``ExaoneConfig``, which reads its own keys (``num_layers``, ``layer_norm_epsilon``,
``activation_function``) as Llama's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "exaone"

_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."), (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
    (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import ExaoneConfig

    full = with_defaults(ARCHITECTURE, ExaoneConfig, cfg)
    bias = bool(full.get("attention_bias", False))
    return ModelConfig(**base_fields(full, ARCHITECTURE), qkv_bias=bias, o_bias=bias)


def exaone_tensor_name(name: str) -> str:
    """An EXAONE checkpoint tensor's name in the shared decoder (Llama's)."""
    for pattern, replacement in _NAMES:
        name = pattern.sub(replacement, name)
    return name

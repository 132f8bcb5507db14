"""LG's EXAONE 3.0 and 3.5 (2.4B, 7.8B, 32B) and EXAONE Deep (``ExaoneForCausalLM``, ``exaone``): Llama's decoder
(3.5's llama3 rope scaling; the 2.4B's tied head) under GPT-2-style names: ``transformer.wte``, ``transformer.h.{i}``
with ``ln_1``/``ln_2``, ``attn.attention.{q,k,v}_proj`` and ``out_proj``, ``mlp.c_fc_0``/``c_fc_1``/``c_proj``,
``transformer.ln_f`` (read under Llama's, as transformers' conversion map reads them). ``config.json`` is completed
with transformers' ``ExaoneConfig``, which reads its own keys (``num_layers``, ``layer_norm_epsilon``,
``activation_function``) as Llama's. llama.cpp's ``exaone`` GGUF files too (:func:`config_from_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = GGUF_ARCHITECTURE = "exaone"

_NAMES = renames((
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


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``exaone`` file's config: Llama's keys, nothing permuted (its converter is no llama subclass),
    3.5's llama3 scaling as ``rope_freqs`` (read by the loader); a turn ends at ``[|endofturn|]``."""
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    head_dim = base["hidden_size"] // base["num_heads"]
    if int(f.get("rope.dimension_count") or head_dim) != head_dim:
        raise ModelLoadError(f"GGUF {GGUF_ARCHITECTURE}: rope.dimension_count {f.get('rope.dimension_count')} is not "
                             f"the head's {head_dim} (EXAONE rotates whole heads)")
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)})


def exaone_tensor_name(name: str) -> str:
    """An EXAONE checkpoint tensor's name in the shared decoder (Llama's)."""
    return renamed(name, _NAMES)

"""AllenAI's OLMo Hybrid (Olmo-Hybrid-7B; ``OlmoHybridForCausalLM``, ``olmo_hybrid``): Gated DeltaNet layers (a
recurrent state per sequence, no KV: ``ModelConfig.linear_attention``, three of every four by ``OlmoHybridConfig``'s
default) with Llama's pre-norm layer around them, and OLMo 3's post-norm attention layers (q and k normed over the
whole projection) between them, which attend without rope where ``rope_parameters`` has no base (the releases');
served by :mod:`services.engine.model.olmo_hybrid_decoder`. ``config.json`` is completed with ``OlmoHybridConfig``'s
defaults; another ``hidden_act`` is refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import LinearAttention, ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "olmo_hybrid"
_KINDS = ("linear_attention", "full_attention")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import OlmoHybridConfig

    full = with_defaults(ARCHITECTURE, OlmoHybridConfig, cfg)
    if full.get("hidden_act") != "silu":
        raise ModelLoadError(f"{ARCHITECTURE}: hidden_act {full.get('hidden_act')!r} is not supported (only 'silu')")
    rope = full.get("rope_parameters") or {}
    unrotated = rope.get("rope_theta") is None
    fields = base_fields({**full, "rope_parameters": None if unrotated else rope}, ARCHITECTURE)
    kinds = list(full["layer_types"])
    if len(kinds) != fields["num_layers"] or set(kinds) - set(_KINDS):
        raise ModelLoadError(f"{ARCHITECTURE}: layer_types must list {fields['num_layers']} of {', '.join(_KINDS)}, "
                             f"got {kinds}")
    delta_net = LinearAttention(
        layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
        key_heads=int(full["linear_num_key_heads"]), value_heads=int(full["linear_num_value_heads"]),
        key_head_dim=int(full["linear_key_head_dim"]), value_head_dim=int(full["linear_value_head_dim"]),
        conv_kernel=int(full["linear_conv_kernel_dim"]), negative_eigenvalues=bool(full["linear_allow_neg_eigval"]))
    attention = tuple(i for i, kind in enumerate(kinds) if kind == "full_attention")
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, linear_attention=delta_net,
                       nope_layers=attention if unrotated else (), rope_in_float32=True)

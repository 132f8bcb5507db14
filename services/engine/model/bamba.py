"""IBM Bamba (Bamba-9B v1/v2; ``BambaForCausalLM``, ``bamba``): the model Granite 4.0's hybrids grew from, served by
their decoder (:mod:`services.engine.model.mamba_decoder`) with every Granite scalar 1. Mamba-2 layers everywhere but
``attn_layer_indices``, each followed by a dense SwiGLU MLP (``feed_forward``, read as ``mlp``); the attention layers
rotate the first half of each head (transformers hard-codes ``partial_rotary_factor`` 0.5 for this family). The step
sizes are floored at ``time_step_limit``'s lower bound, as transformers clamps them; a finite upper bound is refused.
``config.json`` is completed with ``BambaConfig``'s defaults (``mamba_d_head`` "auto": ``mamba_expand`` × hidden /
heads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import Mamba2, ModelConfig, Multipliers
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = "bamba"

_RENAMES = renames([(r"\.feed_forward\.", ".mlp."), (r"\.pre_ff_layernorm\.", ".post_attention_layernorm."),
                    (r"^model\.final_layernorm\.", "model.norm.")])


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import BambaConfig

    full = with_defaults(ARCHITECTURE, BambaConfig, cfg)
    if full.get("mamba_proj_bias"):
        raise ModelLoadError(f"{ARCHITECTURE}: mamba_proj_bias is not supported (no release has it)")
    if full.get("attention_bias"):
        raise ModelLoadError(f"{ARCHITECTURE}: attention_bias is not supported (no release has it)")
    limit = tuple(full.get("time_step_limit") or (0.0, float("inf")))
    if len(limit) != 2 or limit[1] != float("inf"):
        raise ModelLoadError(f"{ARCHITECTURE}: time_step_limit {list(limit)} is not supported (only an upper bound of "
                             "infinity)")
    layers = int(full["num_hidden_layers"])
    attention = tuple(sorted(set(full.get("attn_layer_indices") or ())))
    if not attention or not all(0 <= i < layers for i in attention):
        raise ModelLoadError(f"{ARCHITECTURE}: attn_layer_indices must name at least one of the {layers} layers (a "
                             f"Mamba-only model is not served); got {full.get('attn_layer_indices')}")
    fields = base_fields(full, ARCHITECTURE, partial_rotary=True)
    mamba_layers = tuple(i for i in range(layers) if i not in attention)
    mamba = None if not mamba_layers else Mamba2(
        layers=mamba_layers, heads=int(full["mamba_n_heads"]), head_dim=int(full["mamba_d_head"]),
        state_size=int(full["mamba_d_state"]), groups=int(full["mamba_n_groups"]),
        conv_kernel=int(full["mamba_d_conv"]), conv_bias=bool(full.get("mamba_conv_bias", True)),
        dt_min=float(limit[0]))
    if mamba is not None and mamba.intermediate != int(full["mamba_expand"]) * fields["hidden_size"]:
        raise ModelLoadError(f"{ARCHITECTURE}: mamba_n_heads × mamba_d_head must be mamba_expand × hidden_size")
    return dataclasses.replace(ModelConfig(**fields), mamba=mamba, multipliers=Multipliers())


def bamba_tensor_name(name: str) -> str:
    """A Bamba (or Falcon-H1) checkpoint tensor's name in the decoder (its MLP, the norm before it and the final
    norm)."""
    return renamed(name, _RENAMES)

"""IBM Granite SWA (``GraniteSWAForCausalLM``, ``granite_swa``): Granite's decoder (its four scalars:
:mod:`services.engine.model.granite`) with a learned sink logit per head in every layer's softmax (GPT-OSS's
``sinks``), a window (``sliding_window``) on the layers ``layer_types`` names sliding (three of four by default), and
a rope base per layer (``layer_rope_theta``; 0: the layer attends unrotated), read as ``GraniteSWAConfig`` completes
it. The bases map onto the shared decoder's two ropes: the one most layers take is the main rope, another the local
rope of the layers that take it (``ModelConfig.local_rope_layers``, :mod:`~services.engine.model.typed_ropes`); a
third base, or two under a rope scaling (transformers scales both, the local rope is plain), is refused by name.

Granite MoE SWA (``GraniteMoeSWAForCausalLM``, ``granitemoe_swa``) is the same attention in Granite MoE's layer (its
experts and shared MLP: :mod:`services.engine.model.granite_moe`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.granite import multipliers
from services.engine.model.granite_moe import granite_experts
from services.engine.model.hf_config import base_fields, silu_mlp, typed_layer_windows, with_defaults

ARCHITECTURE = "granite_swa"
MOE_ARCHITECTURE, MOE_MODEL_TYPE = "granite_moe_swa", "granitemoe_swa"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import GraniteMoeSWAConfig, GraniteSWAConfig

    if cfg.get("model_type") != MOE_MODEL_TYPE:
        return _config(with_defaults(ARCHITECTURE, GraniteSWAConfig, cfg), ARCHITECTURE)
    full = with_defaults(MOE_ARCHITECTURE, GraniteMoeSWAConfig, cfg)
    dense = _config(full, MOE_ARCHITECTURE)
    return dataclasses.replace(dense, moe=granite_experts(
        int(full["num_local_experts"]), int(full["num_experts_per_tok"]), dense.intermediate_size, dense.num_layers,
        int(full.get("shared_intermediate_size") or 0)))


def _config(full: Mapping[str, Any], architecture: str) -> ModelConfig:
    fields = base_fields(full, architecture, check_mlp=False)
    layers = fields["num_layers"]
    windows = typed_layer_windows(architecture, list(full["layer_types"]), layers, full.get("sliding_window"))
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**{**fields, **_layer_ropes(full["layer_rope_theta"], layers, fields)}, qkv_bias=bias,
                       o_bias=bias, mlp_bias=silu_mlp(full, architecture), attention_sinks=True,
                       layer_windows=windows if any(w is not None for w in windows) else (),
                       multipliers=multipliers(full))


def _layer_ropes(layer_thetas: list[float], layers: int, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The rope fields of ``layer_rope_theta``: the main base, the local base and its layers, the unrotated layers."""
    thetas = [float(theta or 0) for theta in layer_thetas]
    if len(thetas) != layers:
        raise ModelLoadError(f"granite_swa: layer_rope_theta must list {layers} bases, got {layer_thetas}")
    bases = sorted({theta for theta in thetas if theta})
    if len(bases) > 2 or (len(bases) == 2 and fields["rope_scaling"] is not None):
        raise ModelLoadError(f"granite_swa: layer_rope_theta {layer_thetas} is not supported (at most two bases, "
                             "one under a rope scaling)")
    ropes: dict[str, Any] = {"nope_layers": tuple(i for i, theta in enumerate(thetas) if not theta)}
    if not bases:
        return ropes
    main = max(bases, key=thetas.count)
    ropes["rope_theta"] = main
    for local in bases:
        if local != main:
            ropes |= {"local_rope_theta": local,
                      "local_rope_layers": tuple(i for i, theta in enumerate(thetas) if theta == local)}
    return ropes

"""Cohere's North models (North-Micro-Vision-Instruct: ``CohereCompassForConditionalGeneration``, ``cohere_compass``,
whose text model ``cohere_compass_text`` is served; its vision tower not read): Cohere 2's layer (attention and the
MLP side by side on one bias-free LayerNorm, :mod:`services.engine.model.cohere_decoder`; a window on the layers
``layer_types`` names ``sliding_attention``) with a rope per layer kind from ``rope_parameters`` (rotating the two
halves of each head, not adjacent pairs as Cohere 2's): a kind whose entry is null attends without rope
(``nope_layers``); where both kinds rotate, the full layers' rope is the model's and the sliding layers' must be plain
over the same dims (``local_rope_theta``). Its text-only positions make its M-RoPE the plain rope. ``logit_scale``
null is 1. ``config.json`` is completed with ``CohereCompassTextConfig``'s defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, Multipliers
from services.engine.model.hf_config import base_fields, required, rope_settings, typed_layer_windows, with_defaults
from services.engine.model.multimodal_text import text_config

ARCHITECTURE = "cohere_compass"
TEXT_TYPE = "cohere_compass_text"
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import CohereCompassTextConfig

    text = {**text_config(cfg, ARCHITECTURE), "model_type": TEXT_TYPE}
    full = with_defaults(ARCHITECTURE, CohereCompassTextConfig, text)
    layers = int(required(full, "num_hidden_layers"))
    kinds = list(full["layer_types"])
    windows = typed_layer_windows(ARCHITECTURE, kinds, layers, full.get("sliding_window"))
    ropes = {kind: _plain(full["rope_parameters"].get(kind)) for kind in set(kinds)}
    rotated = [kind for kind in ("full_attention", "sliding_attention") if ropes.get(kind)]
    main = ropes[rotated[0]] if rotated else {"rope_type": "default", "rope_theta": 10000.0}
    fields = base_fields({**full, "rope_parameters": main, "rms_norm_eps": float(required(full, "layer_norm_eps"))},
                         ARCHITECTURE)
    local_theta, local_layers = None, ()
    if len(rotated) == 2:
        local_theta, scaling = rope_settings({"rope_parameters": ropes["sliding_attention"]})
        if scaling is not None:
            raise ModelLoadError(f"{ARCHITECTURE}: the sliding layers' rope must be plain where the full layers "
                                 f"rotate too, got {ropes['sliding_attention']}")
        local_layers = tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
    bias = bool(full.get("attention_bias"))
    scale = full.get("logit_scale")
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, layer_windows=windows,
                       nope_layers=tuple(i for i, kind in enumerate(kinds) if not ropes.get(kind)),
                       local_rope_layers=local_layers, local_rope_theta=local_theta,
                       multipliers=Multipliers(logits_scale=1.0 if scale is None else float(scale)))


def _plain(rope: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A layer kind's rope parameters without the M-RoPE keys (its text positions are one on every axis)."""
    return None if rope is None else {k: v for k, v in rope.items() if k not in _MROPE_KEYS}

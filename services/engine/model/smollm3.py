"""SmolLM3 (HuggingFaceTB/SmolLM3-3B): Llama's decoder with no rotary embedding on some layers (NoPE): a layer
whose ``no_rope_layers`` entry is 0 attends with unrotated q and k (by default every fourth layer,
``no_rope_layer_interval``). With ``use_sliding_window`` (no release sets it) the NoPE layers slide over
``sliding_window``, unless ``layer_types`` says otherwise, as transformers reads it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, typed_layer_windows

ARCHITECTURE = "smollm3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = base_fields(cfg, ARCHITECTURE)
    layers = fields["num_layers"]
    rotated = _rotated_layers(cfg, layers)
    bias = bool(cfg.get("attention_bias", False))
    windows: tuple[int | None, ...] = ()
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") and window is not None:
        kinds = cfg.get("layer_types") or ["full_attention" if r else "sliding_attention" for r in rotated]
        windows = typed_layer_windows(ARCHITECTURE, list(kinds), layers, int(window))
        windows = windows if any(w is not None and w < fields["max_position"] for w in windows) else ()
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, layer_windows=windows,
                       nope_layers=tuple(i for i, r in enumerate(rotated) if not r))


def _rotated_layers(cfg: Mapping[str, Any], layers: int) -> list[bool]:
    """Per layer, whether rope rotates its q and k: ``no_rope_layers`` (1: rotated), else every layer but each
    ``no_rope_layer_interval``-th (transformers' default: 4)."""
    listed = cfg.get("no_rope_layers")
    if listed is None:
        interval = int(cfg.get("no_rope_layer_interval") or 4)
        return [(i + 1) % interval != 0 for i in range(layers)]
    if len(listed) != layers or any(v not in (0, 1) for v in listed):
        raise ModelLoadError(f"{ARCHITECTURE}: no_rope_layers must list {layers} values of 0 or 1, got {listed}")
    return [bool(v) for v in listed]

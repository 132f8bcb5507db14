"""SmolLM3 (HuggingFaceTB/SmolLM3-3B): Llama's decoder with no rotary embedding on some layers (NoPE): a layer
whose ``no_rope_layers`` entry is 0 attends with unrotated q and k (by default every fourth layer,
``no_rope_layer_interval``). With ``use_sliding_window`` (no release sets it) the NoPE layers slide over
``sliding_window``, unless ``layer_types`` says otherwise, as transformers reads it.

llama.cpp's ``smollm3`` GGUF files (:func:`config_from_gguf`) are its llama files (q/k rows permuted, undone by the
loader) that name no NoPE layers: llama.cpp leaves every fourth layer unrotated, as the released checkpoints do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, typed_layer_windows

ARCHITECTURE = GGUF_ARCHITECTURE = "smollm3"
_GGUF_NO_ROPE_INTERVAL = 4  # llama.cpp's n_no_rope_layer_step for every smollm3 file


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


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    layers = base["num_layers"]
    return ModelConfig(**{**base, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       nope_layers=tuple(i for i in range(layers) if (i + 1) % _GGUF_NO_ROPE_INTERVAL == 0))


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

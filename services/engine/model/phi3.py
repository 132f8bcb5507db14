"""Phi-3 and Phi-4 (``Phi3ForCausalLM``): Llama with q/k/v stored as one ``qkv_proj`` and gate/up as one
``gate_up_proj`` (the fused layout the shared decoder runs anyway, :class:`Phi3DecoderModel`), and, where
``sliding_window`` is set (Phi-3-mini-4k: 2047), a sliding window on every layer, served exactly at any length.
``longrope`` scaling (Phi-3.5, Phi-4-mini, the 128k models) and ``partial_rotary_factor`` are refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, every_layer_window

ARCHITECTURE = "phi3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = base_fields(cfg, ARCHITECTURE)
    return ModelConfig(**fields, layer_windows=every_layer_window(cfg, fields["max_position"]))

"""Meta's Code World Model (CWM 32B; ``CwmForCausalLM``, ``cwm``): Llama's decoder (llama3 rope scaling, no biases)
with a sliding window (8192) on three layers of four (``layer_types``; by default every fourth layer from the first
is full), one rope for all layers, served exactly at any length; read as ``CwmConfig`` completes it (its rope, its
three end-of-turn ids where unset)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "cwm"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import CwmConfig

    full = with_defaults(ARCHITECTURE, CwmConfig, cfg)
    fields = base_fields(full, ARCHITECTURE)
    windows = typed_layer_windows(ARCHITECTURE, list(full["layer_types"]), fields["num_layers"],
                                  full.get("sliding_window"))
    return ModelConfig(**fields, layer_windows=windows if any(w is not None for w in windows) else ())

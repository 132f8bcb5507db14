"""Ministral (Ministral-8B-Instruct-2410): Mistral's layer with a window per layer, as ``layer_types`` lists them
(``sliding_attention`` layers slide over ``sliding_window``, ``full_attention`` ones see the whole context; where
the key is absent every layer slides, as transformers completes the config with ``MinistralConfig``'s defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "ministral"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import MinistralConfig

    full = with_defaults(ARCHITECTURE, MinistralConfig, cfg)
    fields = base_fields(full, ARCHITECTURE)
    windows = typed_layer_windows(ARCHITECTURE, list(full["layer_types"]), fields["num_layers"],
                                  full.get("sliding_window"))
    return ModelConfig(**fields, layer_windows=windows if any(w is not None for w in windows) else ())

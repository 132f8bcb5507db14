"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (``Phi3ForCausalLM``): Llama with q/k/v stored as one ``qkv_proj`` and
gate/up as one ``gate_up_proj`` (the fused layout the shared decoder runs anyway, :class:`Phi3DecoderModel`);
where ``sliding_window`` is set (Phi-3-mini-4k: 2047), a sliding window on every layer, served exactly at any
length; ``partial_rotary_factor`` (Phi-4-mini); ``longrope`` (Phi-3.5, Phi-4-mini, the 128k models; "su" and, as
``Phi3Config`` reads it, "yarn" are its other names), served up to ``original_max_position_embeddings``
(``Phi3Config``'s default 4096 where absent)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, every_layer_window

ARCHITECTURE = "phi3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"original_max_position_embeddings": 4096, **cfg}  # Phi3Config's default
    scaling = cfg.get("rope_scaling") or {}
    if (scaling.get("rope_type") or scaling.get("type")) == "yarn":  # Phi3Config reads it as longrope
        cfg["rope_scaling"] = {**scaling, "type": "longrope", "rope_type": "longrope"}
    fields = base_fields(cfg, ARCHITECTURE, partial_rotary=True)
    return ModelConfig(**fields, layer_windows=every_layer_window(cfg, fields["max_position"]))

"""AllenAI's OLMo 3 (7B, 32B; Instruct, Think; ``Olmo3ForCausalLM``, ``olmo3``): OLMo 2's layer
(:class:`~services.engine.model.olmo2_decoder.Olmo2DecoderModel`) with sliding-window attention on the layers
``layer_types`` names ``sliding_attention`` (by default three of every four; ``sliding_window`` 4096), served
exactly at any length, and a rope per kind of layer: the full layers' carries the checkpoint's scaling (the long-context
releases' yarn), the sliding layers' is plain rope of their own base (``ModelConfig.local_rope_layers``, as Gemma 3's).
``config.json`` is completed with transformers' ``Olmo3Config`` defaults; a sliding layers' rope with scaling is
refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, windowed_layers
from services.engine.model.hf_config import base_fields, rope_settings, typed_layer_windows, with_defaults

ARCHITECTURE = "olmo3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Olmo3Config

    full = with_defaults(ARCHITECTURE, Olmo3Config, cfg)
    ropes = full["rope_parameters"]
    local_theta, local_scaling = rope_settings({"rope_parameters": ropes["sliding_attention"]})
    if local_scaling is not None:
        raise ModelLoadError(f"olmo3: the sliding layers' rope must be plain, got {ropes['sliding_attention']}")
    fields = base_fields({**full, "rope_parameters": ropes["full_attention"]}, ARCHITECTURE)
    windows = typed_layer_windows(ARCHITECTURE, list(full["layer_types"]), fields["num_layers"],
                                  full.get("sliding_window"))
    bias = bool(full.get("attention_bias", False))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, layer_windows=windows,
                       local_rope_layers=windowed_layers(windows),
                       local_rope_theta=local_theta)

"""Stability AI's StableLM (StableLM-3B-4E1T, StableLM 2 1.6B, StableLM Zephyr, Stable Code; ``StableLmForCausalLM``,
``stablelm``): LayerNorms with biases (:mod:`services.engine.model.layernorm_decoder`) around Llama's SwiGLU MLP, q/k/v
biases where ``use_qkv_bias`` (never on o_proj), rope on the leading ``partial_rotary_factor`` of each head (a quarter
where unset), attention and the MLP side by side on one norm where ``use_parallel_residual`` (``parallel_blocks``);
read as ``StableLmConfig`` completes it (``layer_norm_eps``). ``qk_layernorm`` (StableLM 2 12B's per-head LayerNorms)
and another ``hidden_act`` are refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "stablelm"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import StableLmConfig

    full = with_defaults(ARCHITECTURE, StableLmConfig, cfg)
    if full.get("qk_layernorm"):
        raise ModelLoadError("stablelm: qk_layernorm is not supported (q and k LayerNormed head by head, StableLM 2 "
                             "12B's)")
    fields = base_fields({**full, "rms_norm_eps": full["layer_norm_eps"]}, ARCHITECTURE, partial_rotary=True)
    return ModelConfig(**fields, qkv_bias=bool(full.get("use_qkv_bias")), layer_norm=True,
                       parallel_blocks=bool(full.get("use_parallel_residual")))

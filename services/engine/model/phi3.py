"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (``Phi3ForCausalLM``): Llama with q/k/v stored as one ``qkv_proj`` and
gate/up as one ``gate_up_proj`` (the fused layouts the shared decoder reads where stored);
where ``sliding_window`` is set (Phi-3-mini-4k: 2047), a sliding window on every layer, served exactly at any
length; ``partial_rotary_factor`` (Phi-4-mini); ``longrope`` (Phi-3.5, Phi-4-mini, the 128k models; "su" and, as
``Phi3Config`` reads it, "yarn" are its other names), served up to ``original_max_position_embeddings``
(``Phi3Config``'s default 4096 where absent).

llama.cpp's ``phi3`` GGUF files (:func:`config_from_gguf`) hold the same tensors (``attn_qkv``; ``ffn_up`` the fused
gate/up, gate rows first; nothing permuted: its rope is NeoX's); the head is hidden / heads and
``rope.dimension_count`` its rotated part; ``attention.sliding_window`` the window (0: none, Phi-4's); longrope is
there when the file has ``rope_factors_short`` (its converter writes no rope type): its short factors, the factor
from ``context_length`` over ``rope.scaling.original_context_length``, the attention factor derived from it as
transformers derives it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kernels.rope_scaling import RopeScaling
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import ROPE_SHORT_FACTORS_KEY, GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, every_layer_window

ARCHITECTURE = GGUF_ARCHITECTURE = "phi3"
log = logging.getLogger(__name__)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"original_max_position_embeddings": 4096, **cfg}  # Phi3Config's default
    scaling = cfg.get("rope_scaling") or {}
    if (scaling.get("rope_type") or scaling.get("type")) == "yarn":  # Phi3Config reads it as longrope
        cfg["rope_scaling"] = {**scaling, "type": "longrope", "rope_type": "longrope"}
    fields = base_fields(cfg, ARCHITECTURE, partial_rotary=True)
    return ModelConfig(**fields, layer_windows=every_layer_window(cfg, fields["max_position"]))


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    head_dim = int(f.get("attention.key_length") or base["hidden_size"] // base["num_heads"])
    rotary = int(f.get("rope.dimension_count") or head_dim)
    scaling, length = _longrope(f, fields.get(ROPE_SHORT_FACTORS_KEY), base["max_position"])
    window = f.get("attention.sliding_window")
    if window is None:  # converters since mid-2024 write it (0: none); the first ones did not
        log.warning("GGUF phi3: the file names no attention.sliding_window; serving it without one (Phi-3-mini-4k's "
                    "first conversions lacked its 2047)")
    return ModelConfig(**{**base, "head_dim": head_dim, "rotary_dim": None if rotary == head_dim else rotary,
                          "rope_scaling": scaling, "max_position": length,
                          "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       layer_windows=every_layer_window({"sliding_window": int(window or 0) or None,
                                                         "num_hidden_layers": base["num_layers"]}, length))


def _longrope(f: GGUFFields, short: tuple[float, ...] | None, context: int) -> tuple[RopeScaling | None, int]:
    """The file's longrope and the length it is served to (its original context, as of the checkpoint). The
    converter's ``attn_factor`` is not read: transformers derives the attention factor from the context's growth
    (Phi3Config reads a ``yarn`` type as longrope too, where the converter wrote yarn's factor)."""
    if not short:
        return None, context
    original = int(f.key("rope.scaling.original_context_length"))
    return RopeScaling(rope_type="longrope", factor=context / original, original_max_position=original,
                       short_factor=short), min(context, original)

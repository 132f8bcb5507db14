"""Mistral 3: Mistral Small 3.1/3.2 and Magistral Small (24B; ``mistral3``, a vision-language checkpoint whose text
model is Mistral's), Ministral 3 (3B/8B/14B; ``mistral3`` around a ``ministral3`` text model) and Devstral 2
(``ministral3``, text only); Mistral Small 4's wrapper too (a ``mistral4`` text model, served by :mod:`mistral4`).

The text model is Mistral's decoder. ``ministral3`` adds yarn rope (Mistral's own ``beta_fast``/``mscale``
settings) and an attention temperature: past the yarn's original context the queries are scaled up by
``1 + llama_4_scaling_beta · log(1 + ⌊p / original⌋)`` (``ModelConfig.query_temperature_beta``; 1 within it). The
vision tower and projector are not read (``multimodal_text``): prompts are text. The FP8 releases (per-tensor
scales) are dequantised at load (``weights/fp8_blocks.py``).

llama.cpp's ``mistral3`` GGUF files (:func:`config_from_gguf`: Ministral 3, Devstral 2, and Mistral's own-format
checkpoints with the temperature) are its llama files (q/k rows permuted as its llama converter permutes them, undone
by the loader) with three keys more: yarn's ``rope.scaling.*`` (its ``yarn_log_multiplier`` the checkpoint's
``mscale_all_dim``, over ``mscale`` 1, as llama.cpp's magnitude term reads it), and ``attention.temperature_scale``,
the ``llama_4_scaling_beta`` whose period is the yarn's original context (the whole context without one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kernels.rope_scaling import RopeScaling
from services.engine.errors import ModelLoadError
from services.engine.model import mistral, mistral4
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, every_layer_window, query_temperature
from services.engine.model.multimodal_text import text_config

ARCHITECTURE = GGUF_ARCHITECTURE = "mistral3"
WRAPPER = "mistral3"
TEXT_MODEL_TYPES = ("mistral", "ministral3", "mistral4")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """A ``mistral3`` config's text model (``mistral``, ``ministral3`` or ``mistral4``), or a ``ministral3`` one's."""
    text = text_config(cfg, WRAPPER, default_tie=True)
    model_type = text.get("model_type", "ministral3" if cfg.get("model_type") == "ministral3" else "mistral")
    if model_type not in TEXT_MODEL_TYPES:
        raise ModelLoadError(f"mistral3: a text model of type {model_type!r} is not supported (only "
                             f"{', '.join(TEXT_MODEL_TYPES)})")
    if model_type == "mistral":  # Mistral Small 3.x, Magistral: Mistral's own text model
        return dataclasses.replace(mistral.config_from_hf(text), architecture=ARCHITECTURE)
    if model_type == "mistral4":  # Mistral Small 4: latent attention and experts (its own family's decoder)
        return mistral4.config_from_hf(text)
    fields = base_fields(text, ARCHITECTURE)
    beta, period = query_temperature(text, model_type)
    # transformers' default where sliding_window is absent: none (every release writes null)
    windows = every_layer_window(text, fields["max_position"])
    return ModelConfig(**fields, layer_windows=windows, query_temperature_beta=beta, query_temperature_period=period)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    head_dim = int(f.get("attention.key_length") or base["hidden_size"] // base["num_heads"])
    beta = f.decimal("attention.temperature_scale", 0.0)
    period = int(f.get("rope.scaling.original_context_length") or base["max_position"]) if beta else 0
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "head_dim": head_dim, "rope_scaling": _yarn(f, base),
                          "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       query_temperature_beta=beta, query_temperature_period=period)


def _yarn(f: GGUFFields, base: Mapping[str, Any]) -> RopeScaling | None:
    """The file's yarn (its betas read with it: :func:`gguf_rope`) with its magnitude term (llama.cpp's
    ``get_mscale(factor, 1) / get_mscale(factor, yarn_log_multiplier)``, transformers' ``mscale`` 1 over
    ``mscale_all_dim``; none written: its default)."""
    scaling = base["rope_scaling"]
    if scaling is None or scaling.rope_type != "yarn":
        return scaling
    written = f.get("rope.scaling.yarn_log_multiplier") is not None
    return dataclasses.replace(
        scaling, mscale=1.0 if written else None,
        mscale_all_dim=f.decimal("rope.scaling.yarn_log_multiplier", 0.0) if written else None)

"""IBM Granite 3.x (granite-3.0 … 3.3, 2B and 8B, base and instruct): Llama's decoder with four scalars
(:class:`~services.engine.model.config.Multipliers`): embeddings times ``embedding_multiplier``, attention
scores scaled by ``attention_multiplier`` (not ``head_dim ** -0.5``), each block's output times
``residual_multiplier``, the logits divided by ``logits_scaling``. llama.cpp's ``granite`` GGUF files too (q/k
rows permuted as its llama converter does; the scalars as ``*_scale`` keys; its tokenizer read as llama's,
:data:`~services.engine.gguf_tokenizer.GGUF_TOKENIZER_AS`). Granite's MoE models (``granitemoe``,
``granitemoeshared``) are :mod:`services.engine.model.granite_moe`; Granite 4.0 (``granitemoehybrid``, Mamba-2
layers) is :mod:`services.engine.model.granite_hybrid`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, Multipliers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields
from services.engine.model.hf_config import base_fields

ARCHITECTURE = "granite"
GGUF_ARCHITECTURE = "granite"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """transformers' defaults where a key is absent or null: every multiplier 1.0 (the attention's too)."""
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base_fields(cfg, ARCHITECTURE), qkv_bias=bias, o_bias=bias, multipliers=multipliers(cfg))


def multipliers(cfg: Mapping[str, Any], logits_multiplied: bool = False) -> Multipliers:
    """Granite's four scalars of a config (1.0 where absent or null): the logits divided by ``logits_scaling``, or
    multiplied by it (``logits_multiplied``: HyperCLOVA X's muP)."""

    def scalar(key: str) -> float:
        return 1.0 if cfg.get(key) is None else float(cfg[key])

    logits = {"logits_scale" if logits_multiplied else "logits_divisor": scalar("logits_scaling")}
    return Multipliers(embedding=scalar("embedding_multiplier"), attention=scalar("attention_multiplier"),
                       residual=scalar("residual_multiplier"), **logits)


def config_from_gguf(fields: Mapping[str, Any], arch: str = GGUF_ARCHITECTURE) -> ModelConfig:
    """As llama.cpp's loader reads it: its converter writes each scale only where it is not 0, and a missing one
    is no scaling (the attention's: ``head_dim ** -0.5``). ``arch``: the keys' prefix (``granitemoe`` too)."""
    f = GGUFFields(fields, arch)  # each float32 scale read back as its checkpoint's decimal (0.22, not 0.2199999…)
    attention = f.decimal("attention.scale", 0.0)
    return ModelConfig(**gguf_base_fields(fields, arch), multipliers=Multipliers(
        embedding=f.decimal("embedding_scale", 1.0), attention=attention or None,
        residual=f.decimal("residual_scale", 1.0), logits_divisor=f.decimal("logit_scale", 1.0)))

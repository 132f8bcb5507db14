"""Gemma 1 (gemma-2b, gemma-7b, Gemma 1.1, CodeGemma; ``GemmaForCausalLM``, ``gemma``): Gemma's layer
(:mod:`services.engine.model.gemma_decoder`: norms scaled by ``1 + weight``, embeddings times ``sqrt(hidden)``, a
tanh-GELU gated MLP) with the norms before attention and the MLP only (``GemmaConfig.post_norms`` off), Llama's
attention (scaled by ``head_dim ** -0.5``, one rope base, no window nor softcap), read as ``GemmaConfig`` completes
it (the releases' ``hidden_act`` "gelu" is the tanh approximation there, so here). llama.cpp's ``gemma`` GGUF files
too (:func:`config_from_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import GemmaConfig, ModelConfig
from services.engine.model.gemma3 import ACTIVATIONS
from services.engine.model.gguf_config import gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = GGUF_ARCHITECTURE = "gemma"


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``gemma`` file's config, read as its loader reads it: queries scaled by ``head_dim``
    (``attention.key_length``), one rope base, the norms stored as ``1 + weight`` (taken off by the loader),
    ``<end_of_turn>`` ending a turn."""
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    if base["rope_scaling"] is not None:
        raise ModelLoadError(f"GGUF gemma: rope scaling is not supported, got {base['rope_scaling'].rope_type}")
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       gemma=GemmaConfig(query_pre_attn_scalar=float(base["head_dim"]),
                                         local_rope_theta=base["rope_theta"], post_norms=False))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import GemmaConfig as HFGemmaConfig

    full = with_defaults(ARCHITECTURE, HFGemmaConfig, cfg)
    if full.get("hidden_act") not in ACTIVATIONS:
        raise ModelLoadError(f"gemma: hidden_act {full.get('hidden_act')!r} is not supported "
                             f"(only {', '.join(ACTIVATIONS)})")
    if full.get("use_bidirectional_attention"):
        raise ModelLoadError("gemma: use_bidirectional_attention (an embedding model) is not supported")
    fields = base_fields(full, ARCHITECTURE, check_mlp=False)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias,
                       gemma=GemmaConfig(query_pre_attn_scalar=float(fields["head_dim"]),
                                         local_rope_theta=fields["rope_theta"], post_norms=False))

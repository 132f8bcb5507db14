"""Gemma 2 (gemma-2-2b, 9b, 27b): Gemma 3's layer (:mod:`services.engine.model.gemma_decoder`) without q/k
norms, with every attention score softcapped (``attn_logit_softcapping``, 50 in every release) as well as the
final logits (30), sliding-window attention (4096) on every other layer from the first, and one rope base for
all layers. ``config.json`` is completed with transformers' own defaults (``Gemma2Config``). llama.cpp's
``gemma2`` GGUF files too (:func:`config_from_gguf`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import GemmaConfig, ModelConfig, windowed_layers
from services.engine.model.gemma3 import ACTIVATIONS
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "gemma2"
GGUF_ARCHITECTURE = "gemma2"
LLAMA_CPP_27B_LAYERS = 46  # llama.cpp scales Gemma-2-27B's queries by hidden / heads, the others' by head_dim
LLAMA_CPP_DEFAULTS = {"attention.sliding_window": 4096, "attn_logit_softcapping": 50.0,
                      "final_logit_softcapping": 30.0}
"""What llama.cpp's loader takes where a ``gemma2`` file lacks the key (early conversions)."""


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return gemma2_config(_full_config(cfg), ARCHITECTURE)


def gemma2_config(full: Mapping[str, Any], architecture: str, post_norms: bool = True) -> ModelConfig:
    """The config of a Gemma 2 ``config.json`` completed with its class's defaults (``full``), as ``architecture``
    (VaultGemma's: ``post_norms`` off)."""
    if full.get("hidden_activation") not in ACTIVATIONS:
        raise ModelLoadError(f"{architecture}: hidden_activation {full.get('hidden_activation')!r} is not supported "
                             f"(only {', '.join(ACTIVATIONS)})")
    if full.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{architecture}: use_bidirectional_attention (an embedding model) is not supported")
    fields = base_fields(full, architecture, check_mlp=False)
    if fields["rope_scaling"] is not None:  # transformers would scale the sliding layers' rope too
        raise ModelLoadError(f"{architecture}: rope scaling is not supported (no release has one), got "
                             f"{fields['rope_scaling'].rope_type}")
    windows = typed_layer_windows(architecture, list(full["layer_types"]), fields["num_layers"],
                                  full.get("sliding_window"))
    bias = bool(full.get("attention_bias", False))
    return ModelConfig(
        **fields, qkv_bias=bias, o_bias=bias, layer_windows=windows, local_rope_layers=windowed_layers(windows),
        attn_logit_softcap=_cap(full.get("attn_logit_softcapping")),
        gemma=GemmaConfig(query_pre_attn_scalar=float(full["query_pre_attn_scalar"]),
                          local_rope_theta=fields["rope_theta"],
                          final_logit_softcap=_cap(full.get("final_logit_softcapping")), post_norms=post_norms),
    )


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``gemma2`` file's config, read as llama.cpp's loader reads it: the window on every other
    layer from the first, the softcaps (llama.cpp's defaults where the file lacks them), queries scaled by
    ``head_dim`` (Gemma-2-27B's 46 layers: ``hidden / heads``; fixed in its code, not in the file)."""
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    f = GGUFFields(fields, GGUF_ARCHITECTURE)

    def setting(name: str) -> Any:
        return f.get(name, LLAMA_CPP_DEFAULTS[name])

    layers, window = base["num_layers"], int(setting("attention.sliding_window"))
    windows = tuple(int(window) if i % 2 == 0 else None for i in range(layers)) if window > 0 else ()
    scalar = base["hidden_size"] // base["num_heads"] if layers == LLAMA_CPP_27B_LAYERS else base["head_dim"]
    if base["rope_scaling"] is not None:
        raise ModelLoadError(f"GGUF gemma2: rope scaling is not supported, got {base['rope_scaling'].rope_type}")
    return ModelConfig(
        **{**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)},
        layer_windows=windows, local_rope_layers=windowed_layers(windows),
        attn_logit_softcap=_cap(setting("attn_logit_softcapping")),
        gemma=GemmaConfig(query_pre_attn_scalar=float(scalar), local_rope_theta=base["rope_theta"],
                          final_logit_softcap=_cap(setting("final_logit_softcapping"))),
    )


def _cap(value: Any) -> float | None:
    """A softcap: None or 0 (llama.cpp's "off") is none."""
    return float(value) if value else None


def _full_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` with transformers' defaults filled in (Google's files predate ``layer_types``)."""
    from transformers import Gemma2Config

    return with_defaults(ARCHITECTURE, Gemma2Config, cfg)

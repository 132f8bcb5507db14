"""Gemma 3: the Llama-shaped decoder with Gemma's norms, GELU MLP and embedding scale (see
:class:`GemmaConfig`), q/k norms, and sliding-window attention on five layers of six (each with its own rope
base), served exactly at any length (:mod:`services.engine.model.gemma_decoder`).

Both checkpoints are read: ``Gemma3ForCausalLM`` (``gemma3_text``: the 1B, and text-only exports) and the
multimodal ``Gemma3ForConditionalGeneration`` (``gemma3``: 4B, 12B, 27B), whose text model is served and whose
vision tower is never read (``multimodal_text.text_tensor_name``). ``config.json`` is completed with transformers' own
defaults (``Gemma3TextConfig``), as Google's files leave most fields out. llama.cpp's ``gemma3`` GGUF files too
(:func:`config_from_gguf`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import GemmaConfig, ModelConfig, windowed_layers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, rope_settings, typed_layer_windows, with_defaults
from services.engine.model.multimodal_text import text_config

ARCHITECTURE = "gemma3"
GGUF_ARCHITECTURE = "gemma3"
LLAMA_CPP_27B_LAYERS = 62  # llama.cpp scales Gemma-3-27B's queries by hidden / heads, the others' by head_dim
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")  # transformers' names of the tanh-approximated GELU


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    text = _text_config(cfg)
    if text.get("hidden_activation") not in ACTIVATIONS:
        raise ModelLoadError(f"gemma3: hidden_activation {text.get('hidden_activation')!r} is not supported "
                             f"(only {', '.join(ACTIVATIONS)})")
    if text.get("attn_logit_softcapping") is not None:
        raise ModelLoadError("gemma3: attn_logit_softcapping is not supported")
    if text.get("use_bidirectional_attention"):
        raise ModelLoadError("gemma3: use_bidirectional_attention (an embedding model) is not supported")
    windows = typed_layer_windows(ARCHITECTURE, list(text["layer_types"]), int(text["num_hidden_layers"]),
                                  text.get("sliding_window"))
    ropes = text["rope_parameters"]
    local_theta, local_scaling = rope_settings({"rope_parameters": ropes["sliding_attention"]})
    if local_scaling is not None:
        raise ModelLoadError(f"gemma3: the sliding layers' rope must be plain, got {ropes['sliding_attention']}")
    fields = base_fields({**text, "rope_parameters": ropes["full_attention"]}, ARCHITECTURE, check_mlp=False)
    bias = bool(text.get("attention_bias", False))
    return ModelConfig(
        **fields, qkv_bias=bias, o_bias=bias, qk_norm=True,
        layer_windows=windows, local_rope_layers=windowed_layers(windows),
        gemma=GemmaConfig(query_pre_attn_scalar=float(text["query_pre_attn_scalar"]), local_rope_theta=local_theta,
                          final_logit_softcap=None if text.get("final_logit_softcapping") is None
                          else float(text["final_logit_softcapping"])),
    )


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``gemma3`` file's config, read as llama.cpp's loader reads it: the window (none without
    ``attention.sliding_window``) on five layers of six, the sliding layers' rope base 10000, queries scaled by
    ``head_dim`` (Gemma-3-27B's 62 layers: ``hidden / heads``; both fixed in its code, not in the file), a
    linear rope scaling where the file has one."""
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    layers, window, pattern = base["num_layers"], f.get("attention.sliding_window"), 6
    scalar = (base["hidden_size"] // base["num_heads"] if layers == LLAMA_CPP_27B_LAYERS else base["head_dim"])
    softcap = f.get("final_logit_softcapping")
    windows = () if not window else tuple(None if (i + 1) % pattern == 0 else int(window) for i in range(layers))
    return ModelConfig(
        **{**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)}, qk_norm=True,
        layer_windows=windows, local_rope_layers=windowed_layers(windows),
        gemma=GemmaConfig(query_pre_attn_scalar=float(scalar),
                          local_rope_theta=10000.0,
                          final_logit_softcap=float(softcap) if softcap else None),
    )


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's config with transformers' defaults filled in (a multimodal config's ``text_config``)."""
    from transformers import Gemma3TextConfig

    text = text_config(cfg, "gemma3", default_tie=True)
    text["model_type"] = "gemma3_text"
    return with_defaults(ARCHITECTURE, Gemma3TextConfig, text)

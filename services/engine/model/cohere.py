"""Cohere's Command R (35B, 08-2024) and Aya 23 / Aya Expanse (``CohereForCausalLM``, ``cohere``), Command R7B and
Command A (``Cohere2ForCausalLM``, ``cohere2``): one norm per layer feeding attention and the MLP side by side,
``h = h + attention(x) + mlp(x)`` with ``x = norm(h)`` (:mod:`services.engine.model.cohere_decoder`); the norms
LayerNorms without a bias (the mean taken off, in float32, ``layer_norm_eps``); rope on pairs of adjacent dims; the
head tied to the embedding, its logits times ``logit_scale``. Cohere 2's layers that ``layer_types`` names
``sliding_attention`` attend within ``sliding_window`` with rope, the others over everything without rope.

Command R+ (``use_qk_norm``): q and k LayerNormed head by head before rope, each head with weights of its own.
``config.json`` is completed with transformers' ``CohereConfig`` / ``Cohere2Config`` defaults.

llama.cpp's ``command-r`` and ``cohere2`` GGUF files (:func:`config_from_gguf`), read as its loader reads them: the
norms' ``attention.layer_norm_epsilon``, ``logit_scale`` (required, as llama.cpp requires it; 0: none), R+'s head
norms where the file holds ``attn_q_norm``, nothing permuted (its rope is already on adjacent pairs), the head tied;
Cohere 2's window ``attention.sliding_window`` on the layers ``attention.sliding_window_pattern`` marks (a flag a
layer, or a period: every n-th layer full), else on three layers of every four (llama.cpp's default; the dense
converter writes no pattern), the others attending over everything without rope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, Multipliers, full_layers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_sliding_layers, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, required, typed_layer_windows, with_defaults

ARCHITECTURE = "cohere"
_GGUF_SWA_PATTERN = 4  # llama.cpp's cohere2: every fourth layer full


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Cohere2Config, CohereConfig

    model_type = str(cfg.get("model_type") or ARCHITECTURE)
    full = with_defaults(model_type, Cohere2Config if model_type == "cohere2" else CohereConfig, cfg)
    fields = base_fields({**full, "rms_norm_eps": float(required(full, "layer_norm_eps"))}, ARCHITECTURE)
    windows: tuple[int | None, ...] = ()
    if model_type == "cohere2":
        windows = typed_layer_windows(model_type, list(full["layer_types"]), fields["num_layers"],
                                      full.get("sliding_window"))
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, qk_norm=bool(full.get("use_qk_norm")),
                       rope_interleaved=True, layer_windows=windows,
                       nope_layers=full_layers(windows),
                       multipliers=Multipliers(logits_scale=float(required(full, "logit_scale"))))


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    arch = str(fields.get("general.architecture"))
    f = GGUFFields(fields, arch)
    eps = f.key("attention.layer_norm_epsilon")
    base = gguf_base_fields({**fields, f"{arch}.attention.layer_norm_rms_epsilon": eps}, arch)
    windows: tuple[int | None, ...] = ()
    if arch == "cohere2":
        windows = gguf_sliding_layers(f, base["num_layers"], int(f.key("attention.sliding_window")), _GGUF_SWA_PATTERN)
    f.key("logit_scale")  # required, as llama.cpp's loader requires it (0: no scale)
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       qk_norm=f.has_tensor(".attn_q_norm.weight"), rope_interleaved=True, layer_windows=windows,
                       nope_layers=full_layers(windows),
                       multipliers=Multipliers(logits_scale=f.decimal("logit_scale", 1.0)))

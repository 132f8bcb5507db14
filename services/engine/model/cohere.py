"""Cohere's Command R (35B, 08-2024) and Aya 23 / Aya Expanse (``CohereForCausalLM``, ``cohere``), Command R7B and
Command A (``Cohere2ForCausalLM``, ``cohere2``): one norm per layer feeding attention and the MLP side by side,
``h = h + attention(x) + mlp(x)`` with ``x = norm(h)`` (:mod:`services.engine.model.cohere_decoder`); the norms
LayerNorms without a bias (the mean taken off, in float32, ``layer_norm_eps``); rope on pairs of adjacent dims; the
head tied to the embedding, its logits times ``logit_scale``. Cohere 2's layers that ``layer_types`` names
``sliding_attention`` attend within ``sliding_window`` with rope, the others over everything without rope.

Command R+ (``use_qk_norm``): q and k LayerNormed head by head before rope, each head with weights of its own.
Command A Plus (``Cohere2MoeForCausalLM``, ``cohere2_moe``): Cohere 2's layer with experts (:func:`_cohere2_moe`).
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

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig, Multipliers, full_layers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_sliding_layers, gguf_turn_end_ids
from services.engine.model.hf_config import (
    base_fields,
    required,
    sparse_mlp_layers,
    typed_layer_windows,
    with_defaults,
)

ARCHITECTURE = "cohere"
COHERE2_MOE = "cohere2_moe"
_GGUF_SWA_PATTERN = 4  # llama.cpp's cohere2: every fourth layer full


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Cohere2Config, CohereConfig

    model_type = str(cfg.get("model_type") or ARCHITECTURE)
    if model_type == COHERE2_MOE:
        return _cohere2_moe(cfg)
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


def _cohere2_moe(cfg: Mapping[str, Any]) -> ModelConfig:
    """Command A Plus's config (``Cohere2MoeConfig``'s defaults): Cohere 2's layer with RMSNorms where
    ``rms_norm_eps`` is set, dense MLPs (``prefix_dense_intermediate_size`` wide) on the layers ``mlp_layer_types``
    names dense, rotated also where full when ``prefix_dense_sliding_window_pattern`` is 1; experts elsewhere, routed by
    the softmax (or, ``expert_selection_fn``, the sigmoid) of each token's top-k logits, beside shared experts summed
    or averaged with them (``shared_expert_combination_strategy``)."""
    from transformers import Cohere2MoeConfig

    full = with_defaults(COHERE2_MOE, Cohere2MoeConfig, cfg)
    rms = full.get("rms_norm_eps") is not None
    eps = float(full["rms_norm_eps"] if rms else required(full, "layer_norm_eps"))
    kinds = list(full["mlp_layer_types"])
    dense = [i for i, kind in enumerate(kinds) if kind == "dense"]
    width = int(full.get("prefix_dense_intermediate_size") or full["intermediate_size"])
    fields = base_fields({**full, "rms_norm_eps": eps, "intermediate_size": width}, COHERE2_MOE)
    layers = fields["num_layers"]
    windows = typed_layer_windows(COHERE2_MOE, list(full["layer_types"]), layers, full.get("sliding_window"))
    rotated = set(dense) if int(full["prefix_dense_sliding_window_pattern"]) == 1 else set()
    selection, combination = full["expert_selection_fn"], full["shared_expert_combination_strategy"]
    if selection not in ("softmax", "sigmoid") or combination not in ("sum", "average"):
        raise ModelLoadError(f"cohere2_moe: expert_selection_fn {selection!r} with shared_expert_combination_strategy "
                             f"{combination!r} is not supported (softmax or sigmoid; sum or average)")
    experts = int(full["intermediate_size"])
    moe = MoEConfig(num_experts=int(full["num_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=experts, norm_topk_prob=selection == "sigmoid" and bool(full["norm_topk_prob"]),
                    sparse_layers=sparse_mlp_layers(full, layers, COHERE2_MOE),
                    softmax_after_topk=selection == "softmax", sigmoid_after_topk=selection == "sigmoid",
                    shared_expert_intermediate_size=experts * int(full["num_shared_experts"] or 0) or None,
                    shared_expert_gated=False, shared_expert_average=combination == "average")
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, rope_interleaved=True, layer_windows=windows,
                       nope_layers=tuple(i for i in full_layers(windows) if i not in rotated),
                       moe=moe if moe.sparse_layers else None, cohere_rms_norms=rms,
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

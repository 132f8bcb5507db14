"""Moonshot's Kimi Linear (Kimi-Linear-48B-A3B; ``KimiLinearForCausalLM``, ``kimi_linear``): a hybrid of Kimi Delta
Attention layers (a recurrent state per sequence, no KV: ``LinearAttention.channel_decay``) and DeepSeek-V3's
multi-head latent attention without any rope (``nope_layers``: its rope part of the keys is cached and attended
unrotated), dense MLPs on the layers ``mlp_layer_types`` names dense and DeepSeek-V3's experts elsewhere (the sigmoid
routing among the ``topk_group`` best of ``num_expert_group`` groups, the correction bias, shared experts), plain
RMSNorms; served by :mod:`services.engine.model.kimi_linear_decoder`.

The layer kinds as ``layer_types`` lists them, or as ``linear_attn_config`` numbers them from 1 (``kda_layers``,
``full_attn_layers``: ``KimiLinearConfig`` reads either, and is what completes ``config.json`` here). The released
files' names (``block_sparse_moe.experts.N.w1/w3/w2``, ``shared_experts``, the convolution per q/k/v) are read as
they are (:func:`kimi_linear_tensor_name`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import LinearAttention, ModelConfig, MoEConfig
from services.engine.model.deepseek import latent_config, sparse_mlp
from services.engine.model.glm4_moe import glm4_moe_tensor_name
from services.engine.model.hf_config import sparse_mlp_layers, with_defaults
from services.engine.model.mixtral import mixtral_tensor_name

ARCHITECTURE = "kimi_linear"
_KINDS = ("linear_attention", "full_attention")
# KimiLinearConfig's (and BailingHybridConfig's) attribute map: the keys its to_dict writes, as the DeepSeek readers
# name them
_DEEPSEEK_KEYS = {"num_experts": "n_routed_experts", "num_experts_per_token": "num_experts_per_tok",
                  "num_shared_experts": "n_shared_experts", "moe_renormalize": "norm_topk_prob",
                  "num_expert_group": "n_group", "model_max_length": "max_position_embeddings"}


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import KimiLinearConfig

    full = with_defaults(ARCHITECTURE, KimiLinearConfig, cfg)
    kinds, moe = kda_hybrid_parts(full, ARCHITECTURE)
    heads, width = int(full["linear_num_heads"]), int(full["linear_head_dim"])
    kda = LinearAttention(layers=tuple(i for i, kind in enumerate(kinds) if kind == "linear_attention"),
                          key_heads=heads, value_heads=heads, key_head_dim=width, value_head_dim=width,
                          conv_kernel=int(full["linear_conv_kernel_dim"]), channel_decay=True)
    config = latent_config(full, ARCHITECTURE, moe, interleaved=False)
    return dataclasses.replace(config, linear_attention=kda,
                               nope_layers=tuple(i for i, kind in enumerate(kinds) if kind == "full_attention"))


def kda_hybrid_parts(full: dict[str, Any], architecture: str) -> tuple[list[str], MoEConfig | None]:
    """A KDA hybrid's layer kinds and DeepSeek-V3 experts (Kimi Linear's, Ling 3's), from its config as its class
    completes it (``full``: the DeepSeek readers' names added for its own); another activation, or a kind list of
    another length or kind, refused by name."""
    full |= {ours: full[theirs] for theirs, ours in _DEEPSEEK_KEYS.items() if theirs in full}
    if full.get("hidden_act") != "silu":
        raise ModelLoadError(f"{architecture}: hidden_act {full.get('hidden_act')!r} is not supported (only 'silu')")
    layers = int(full["num_hidden_layers"])
    kinds = list(full["layer_types"])
    if len(kinds) != layers or set(kinds) - set(_KINDS):
        raise ModelLoadError(f"{architecture}: layer_types must list {layers} of {', '.join(_KINDS)}, got {kinds}")
    moe = sparse_mlp(full, sparse_mlp_layers(full, layers, architecture), sigmoid_routing=True,
                     expert_groups=int(full.get("n_group") or 1), top_groups=int(full.get("topk_group") or 1))
    return kinds, moe


def kimi_linear_tensor_name(name: str) -> str:
    """A released tensor's name in the decoder: the experts and router of ``block_sparse_moe`` as the shared
    decoder's ``mlp``, its shared experts as the decoder's shared expert."""
    return glm4_moe_tensor_name(mixtral_tensor_name(name).replace(".block_sparse_moe.", ".mlp."))

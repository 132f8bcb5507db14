"""AI21 Jamba (Jamba v0.1, Jamba 1.5 / 1.6 / 1.7 Mini and Large, Jamba Reasoning 3B; ``JambaForCausalLM``, ``jamba``): a
hybrid of Mamba (Mamba-1) layers and attention layers, one in ``attn_layer_period`` (at ``attn_layer_offset``), served
by :mod:`services.engine.model.jamba_decoder`. The attention has no positional encoding at all (every attention layer
unrotated: ``nope_layers``); the Mamba layers' selective scan (``ModelConfig.mamba1``) norms its step-size rows and B
and C (``Mamba1.inner_norms``). The MLP is experts on one layer in ``expert_layer_period`` (at
``expert_layer_offset``: the top-k of the softmax, not renormalised) and dense elsewhere.

``config.json`` is completed with ``JambaConfig``'s defaults (``mamba_dt_rank`` "auto": ``ceil(hidden / 16)``);
``mamba_proj_bias`` (no release has it) is refused by name, as is a model without an attention layer (a Mamba-only
model is not served).

llama.cpp's ``jamba`` GGUF files (:func:`config_from_gguf`): the attention layers those whose entry of the per-layer
``attention.head_count_kv`` is not 0, the Mamba layers from ``ssm.*`` (``time_step_rank`` the step sizes' rank; their
tensors laid out by :func:`services.engine.model.mamba_gguf.mamba_from_gguf`), the sparse layers those that hold
a router (``ffn_gate_inp``: the converter writes no expert period), the experts stacked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.bamba import bamba_tensor_name
from services.engine.model.config import Mamba1, ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, per_layer
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = GGUF_ARCHITECTURE = "jamba"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import JambaConfig

    full = with_defaults(ARCHITECTURE, JambaConfig, cfg)
    if full.get("mamba_proj_bias"):
        raise ModelLoadError(f"{ARCHITECTURE}: mamba_proj_bias is not supported (no release has it)")
    layers = int(full["num_hidden_layers"])
    period, offset = int(full["attn_layer_period"]), int(full["attn_layer_offset"])
    attention = tuple(i for i in range(layers) if i % period == offset)
    if not attention:
        raise ModelLoadError(f"{ARCHITECTURE}: attn_layer_period {period} and attn_layer_offset {offset} leave no "
                             f"attention layer among {layers} (a Mamba-only model is not served)")
    fields = base_fields(full, ARCHITECTURE)
    mamba = tuple(i for i in range(layers) if i not in attention)
    mamba1 = None if not mamba else Mamba1(
        layers=mamba, inner=int(full["mamba_expand"]) * fields["hidden_size"], state_size=int(full["mamba_d_state"]),
        conv_kernel=int(full["mamba_d_conv"]), dt_rank=int(full["mamba_dt_rank"]),
        conv_bias=bool(full.get("mamba_conv_bias", True)), inner_norms=True)
    experts = int(full.get("num_experts") or 1)
    every, at = int(full["expert_layer_period"]), int(full["expert_layer_offset"])
    moe = None if experts <= 1 else MoEConfig(
        num_experts=experts, top_k=int(full["num_experts_per_tok"]), intermediate_size=fields["intermediate_size"],
        norm_topk_prob=False, sparse_layers=tuple(i for i in range(layers) if i % every == at))
    return dataclasses.replace(ModelConfig(**fields), mamba1=mamba1, moe=moe, nope_layers=attention)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    kv_heads = per_layer(f, "attention.head_count_kv")
    layers = len(kv_heads)
    attention = tuple(i for i in range(layers) if kv_heads[i])
    if not attention:
        raise ModelLoadError(f"GGUF {GGUF_ARCHITECTURE}: no attention layer (a Mamba-only model is not served)")
    mamba = tuple(i for i in range(layers) if not kv_heads[i])
    mamba1 = None if not mamba else Mamba1(
        layers=mamba, inner=int(f.key("ssm.inner_size")), state_size=int(f.key("ssm.state_size")),
        conv_kernel=int(f.key("ssm.conv_kernel")), dt_rank=int(f.key("ssm.time_step_rank")),
        conv_bias=f.has_tensor(".ssm_conv1d.bias"), inner_norms=f.has_tensor(".ssm_dt_norm.weight"))
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    sparse = tuple(i for i in range(layers) if f.has_tensor(f"blk.{i}.ffn_gate_inp.weight"))
    moe = None if not sparse else MoEConfig(
        num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
        intermediate_size=base["intermediate_size"], norm_topk_prob=False, sparse_layers=sparse)
    return ModelConfig(**base, mamba1=mamba1, moe=moe, nope_layers=attention)


def jamba_tensor_name(name: str) -> str:
    """A Jamba checkpoint tensor's name in the decoder: Bamba's renames (its MLP, the norm before it and the final
    norm), the experts' router read as ``mlp.gate``."""
    return bamba_tensor_name(name.replace(".feed_forward.router.", ".feed_forward.gate."))

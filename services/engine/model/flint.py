"""RecursiveSI's Flint (``FlintForCausalLM``, ``flint``): Qwen3-MoE's layer (per-head q/k norms, experts) with

- a learned sink per head in every softmax (``sinks``, float32: ``ModelConfig.attention_sinks``, GPT-OSS's; its
  files name it ``softmax_offset``);
- a window (``sliding_window``, 513) on the layers ``layer_types`` names ``sliding_attention``, which alone rotate:
  the full-attention layers (the first two, every fourth from the second, and the last, by ``FlintConfig``'s
  default) attend without rope (``nope_layers``);
- experts chosen by the sigmoid of float32 router logits with no correction bias (``MoEConfig.sigmoid_routing``
  with ``correction_bias_optional``: its routers have none), renormalised, beside an ungated shared expert; dense
  MLPs on ``mlp_only_layers``.

``config.json`` is completed with ``FlintConfig``'s defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig, full_layers
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "flint"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import FlintConfig

    full = with_defaults(ARCHITECTURE, FlintConfig, cfg)
    fields = base_fields(full, ARCHITECTURE)
    layers = fields["num_layers"]
    windows = typed_layer_windows(ARCHITECTURE, list(full["layer_types"]), layers, full.get("sliding_window"))
    dense = set(full.get("mlp_only_layers") or ())
    moe = MoEConfig(num_experts=int(full["num_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=int(full["moe_intermediate_size"]), norm_topk_prob=bool(full["norm_topk_prob"]),
                    sparse_layers=tuple(i for i in range(layers) if i not in dense), sigmoid_routing=True,
                    correction_bias_optional=True,
                    shared_expert_intermediate_size=int(full["shared_expert_intermediate_size"]) or None,
                    shared_expert_gated=False)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, qk_norm=True, attention_sinks=True, moe=moe,
                       layer_windows=windows, nope_layers=full_layers(windows))


def flint_tensor_name(name: str) -> str:
    """A Flint checkpoint tensor's name in the shared decoder (its sinks stored as ``softmax_offset``)."""
    return name.replace(".self_attn.softmax_offset", ".self_attn.sinks")

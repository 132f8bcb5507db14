"""Mixtral (8x7B, 8x22B): Mistral's attention with a sparse mixture of experts on every layer (softmax router,
top-k renormalised; each expert a SwiGLU MLP of ``intermediate_size``). Its checkpoints name the block
``block_sparse_moe`` and an expert's projections ``w1`` (gate), ``w3`` (up) and ``w2`` (down);
:func:`mixtral_tensor_name` maps them to the shared decoder's names. GGUF files of Mixtral are llama.cpp's
``llama`` architecture with experts (:mod:`services.engine.model.llama`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.hf_config import base_fields, every_layer_window, required

ARCHITECTURE = "mixtral"
# (an FP8 checkpoint's block scales, weight_scale_inv, follow their weights)
_EXPERT = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.experts\.(\d+)\.(w[123])\.(weight(?:_scale_inv)?)$")
_PROJECTIONS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def every_layer_experts(num_experts: int, top_k: int, intermediate_size: int, num_layers: int) -> MoEConfig:
    """Mixtral's routing: the softmax of the router's logits, the top-k renormalised, on every layer."""
    return MoEConfig(num_experts=num_experts, top_k=top_k, intermediate_size=intermediate_size,
                     norm_topk_prob=True, sparse_layers=tuple(range(num_layers)))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = base_fields(cfg, ARCHITECTURE)
    moe = every_layer_experts(int(required(cfg, "num_local_experts")), int(required(cfg, "num_experts_per_tok")),
                              fields["intermediate_size"], fields["num_layers"])
    # MixtralConfig: no window unless sliding_window is set (every release writes null); then on every layer
    return ModelConfig(**fields, moe=moe, layer_windows=every_layer_window(cfg, fields["max_position"]))


def mixtral_tensor_name(name: str) -> str:
    """A Mixtral checkpoint tensor's name in the shared decoder (``block_sparse_moe.gate`` is the router)."""
    if (match := _EXPERT.match(name)) is not None:
        layer, expert, projection, kind = match.groups()
        return f"{layer}mlp.experts.{expert}.{_PROJECTIONS[projection]}.{kind}"
    return name.replace(".block_sparse_moe.gate.", ".mlp.gate.")

"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``, ``glm4_moe_lite``): DeepSeek-V3's latent attention
(:func:`~services.engine.model.deepseek.latent_config`) with GLM-4.5's experts (sigmoid routing with a correction
bias, ``n_shared_experts`` ungated shared experts), dense or sparse per layer as ``mlp_layer_types`` says (by
default dense on the first layer only, as ``Glm4MoeLiteConfig`` sets it; ``first_k_dense_replace`` is not read).
Its multi-token-prediction layer after the last (``model.layers.47.*``) is not read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.deepseek import latent_config, present, sparse_mlp
from services.engine.model.hf_config import required, sparse_mlp_layers

ARCHITECTURE = "glm4_moe_lite"

# Glm4MoeLiteConfig's
_DEFAULTS = {"n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.8, "norm_topk_prob": True, "q_lora_rank": 768,
             "rope_interleave": True, "rms_norm_eps": 1e-5, "n_routed_experts": 64, "n_shared_experts": 1}


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {**_DEFAULTS, **present(cfg)}
    layers = int(required(cfg, "num_hidden_layers"))
    moe = sparse_mlp(cfg, sparse_mlp_layers(cfg, layers, "glm4_moe_lite"), sigmoid_routing=True,
                     expert_groups=int(cfg["n_group"]), top_groups=int(cfg["topk_group"]))
    return latent_config(cfg, ARCHITECTURE, moe, interleaved=bool(cfg["rope_interleave"]))

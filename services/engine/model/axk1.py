"""SK Telecom's A.X-K1 (``AXK1ForCausalLM``, ``axk1``): DeepSeek-V3's model (multi-head latent attention, q always
through its low-rank bottleneck; the sigmoid routing among the ``topk_group`` best of ``n_group`` groups beside one
ungated shared expert, :func:`~services.engine.model.deepseek.latent_config`) with an RMSNorm on each sparse
block's output, routed and shared experts summed (``post_mlp_layernorm``: ``MoEConfig.output_norm``; the dense
layers' stored copy is not read, as transformers ignores it). Its routers carry no ``e_score_correction_bias``: a
missing one is none (``MoEConfig.correction_bias_optional``), as transformers starts it at zero. The sparse layers
as ``mlp_layer_types`` lists them (``AXK1Config`` derives it from ``first_k_dense_replace``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.deepseek import latent_config, sparse_mlp
from services.engine.model.hf_config import sparse_mlp_layers, with_defaults

ARCHITECTURE = "axk1"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import AXK1Config

    full = with_defaults(ARCHITECTURE, AXK1Config, cfg)
    if full.get("q_lora_rank") is None:
        raise ModelLoadError(f"{ARCHITECTURE}: q_lora_rank must be set (its attention always takes q through it)")
    layers = int(full["num_hidden_layers"])
    moe = sparse_mlp(full, sparse_mlp_layers(full, layers, ARCHITECTURE), sigmoid_routing=True,
                     expert_groups=int(full.get("n_group") or 1), top_groups=int(full.get("topk_group") or 1))
    if moe is not None:
        moe = dataclasses.replace(moe, output_norm=True, correction_bias_optional=True)
    return latent_config(full, ARCHITECTURE, moe, interleaved=bool(full.get("rope_interleave", True)))

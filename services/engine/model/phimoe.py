"""Microsoft's Phi-3.5-MoE (42B-A6.6B; ``PhimoeForCausalLM``, ``phimoe``): Mixtral's layer (experts on every layer,
named ``block_sparse_moe``: :func:`~services.engine.model.mixtral.mixtral_tensor_name`) with LayerNorms
(:mod:`services.engine.model.layernorm_decoder`), q/k/v/o biases (``attention_bias``), an LM head with a bias
(``lm_head_bias``), the sparsemixer router (``MoEConfig.sparse_mixer_eps``: its ``router_jitter_noise``) and its
longrope: transformers' Phimoe rotates every position with the short factors, scaled by ``short_mscale`` within
``original_max_position_embeddings`` and ``long_mscale`` past it, so it is served at its whole context where the two
are equal (the release's) and up to the original context otherwise (logged), as Phi-3's longrope is. Read as
``PhimoeConfig`` completes it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, every_layer_window, rope_settings, with_defaults
from services.engine.model.mixtral import every_layer_experts

log = logging.getLogger(__name__)

ARCHITECTURE = "phimoe"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import PhimoeConfig

    full = with_defaults(ARCHITECTURE, PhimoeConfig, cfg)
    rope = dict(full.get("rope_parameters") or {})
    length = int(full["max_position_embeddings"])
    scaling = None
    if rope.get("rope_type", "default") != "default":
        if rope.get("rope_type") != "longrope":
            raise ModelLoadError(f"phimoe: rope type {rope.get('rope_type')!r} is not supported (only longrope)")
        short, long = float(rope["short_mscale"]), float(rope["long_mscale"])
        original = int(rope["original_max_position_embeddings"])
        if short != long and original < length:
            log.warning("phimoe: serving at most %d tokens (max_position_embeddings %d): past them transformers "
                        "scales every position by long_mscale", original, length)
            length = original
        _, scaling = rope_settings({**full, "rope_parameters": {**rope, "attention_factor": short}})
    # (the plain rope's fields: base_fields would cap a longrope at its original context, which this one is not)
    fields = base_fields({**full, "rope_parameters": {"rope_type": "default", "rope_theta": rope.get("rope_theta")}},
                         ARCHITECTURE)
    if scaling is not None and len(scaling.short_factor or ()) != fields["head_dim"] // 2:
        raise ModelLoadError(f"phimoe: longrope has {len(scaling.short_factor or ())} short factors, the head needs "
                             f"{fields['head_dim'] // 2}")
    bias = bool(full.get("attention_bias"))
    moe = every_layer_experts(int(full["num_local_experts"]), int(full["num_experts_per_tok"]),
                              fields["intermediate_size"], fields["num_layers"])
    return ModelConfig(**{**fields, "max_position": length, "rope_scaling": scaling}, qkv_bias=bias, o_bias=bias,
                       layer_norm=True,
                       lm_head_bias=bool(full.get("lm_head_bias")),
                       moe=dataclasses.replace(moe, norm_topk_prob=False,
                                               sparse_mixer_eps=float(full["router_jitter_noise"])),
                       layer_windows=every_layer_window(full, length))

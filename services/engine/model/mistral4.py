"""Mistral 4: Mistral Small 4 (119B, 6.5B active; ``mistral3`` around a ``mistral4`` text model, as released) and a
``mistral4`` text model on its own (``Mistral4ForCausalLM``).

The text model is DeepSeek-V3's (:func:`~services.engine.model.deepseek.latent_config`): latent attention with yarn
(its ``mscale_all_dim`` on the scores) and rope on adjacent pairs (``rope_interleave``), experts from the
``first_k_dense_replace``-th layer on beside ``n_shared_experts`` ungated shared experts. What Mistral adds:

- the router's **softmax** (not DeepSeek-V3's sigmoid, no correction bias), its top-k chosen among the
  ``topk_group`` best of ``n_group`` groups, a group scored by the sum of its best two probabilities
  (:attr:`~services.engine.model.config.MoEConfig.grouped_softmax`), renormalised (``norm_topk_prob``) and times
  ``routed_scaling_factor``; computed in float32 (transformers: in the model dtype);
- Ministral 3's **attention temperature**: after rope the queries at position p are multiplied by
  ``1 + llama_4_scaling_beta · log(1 + ⌊p / original_max_position_embeddings⌋)`` (the latent decoder applies
  :attr:`~services.engine.model.config.ModelConfig.query_temperature_beta` as the shared one does).

The vision tower and projector are not read (``multimodal_text``). The FP8 release (per-tensor scales) is
dequantised at load (``weights/fp8_blocks.py``).

llama.cpp's ``mistral4`` GGUF files (:func:`config_from_gguf`) are its DeepSeek files (the latent attention read as
:mod:`services.engine.model.deepseek_gguf` reads it: ``kv_b`` split in ``attn_k_b``/``attn_v_b``, yarn's
``mscale_all_dim`` a tenth of ``yarn_log_multiplier``) with the experts' gate and up kept fused
(``ffn_gate_up_exps``, gate rows first) and the softmax routing (another ``expert_gating_func`` is refused; llama.cpp
scores a group as Mistral does, by its best two). The temperature is the file's ``attention.temperature_scale`` over
``attention.temperature_length`` (else the yarn's original context): its converter writes neither for a Hugging Face
checkpoint, so such a file is served as llama.cpp serves it, without the temperature (1 within the original context).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.deepseek import latent_config, present, sparse_mlp
from services.engine.model.deepseek_gguf import latent_fields, with_file_ids
from services.engine.model.gguf_config import SOFTMAX_GATING, require_gating
from services.engine.model.hf_config import query_temperature, required

ARCHITECTURE = GGUF_ARCHITECTURE = "mistral4"

# Mistral4Config's
_DEFAULTS = {"first_k_dense_replace": 0, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
             "norm_topk_prob": True, "q_lora_rank": 1024, "n_routed_experts": 128, "n_shared_experts": 1,
             "rope_interleave": True, "rms_norm_eps": 1e-6}


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """A ``mistral4`` text config (on its own, or a ``mistral3`` wrapper's ``text_config``)."""
    cfg = {**_DEFAULTS, **present(cfg)}
    layers = int(required(cfg, "num_hidden_layers"))
    moe = sparse_mlp(cfg, tuple(range(int(cfg["first_k_dense_replace"]), layers)), grouped_softmax=True,
                     expert_groups=int(cfg["n_group"]), top_groups=int(cfg["topk_group"]))
    config = latent_config(cfg, ARCHITECTURE, moe, interleaved=bool(cfg["rope_interleave"]))
    beta, period = query_temperature(cfg, ARCHITECTURE)
    return dataclasses.replace(config, query_temperature_beta=beta, query_temperature_period=period)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    cfg, f = latent_fields(fields, GGUF_ARCHITECTURE)
    require_gating(f, SOFTMAX_GATING, "Mistral 4")
    cfg.update(n_routed_experts=int(f.key("expert_count")), num_experts_per_tok=int(f.key("expert_used_count")),
               moe_intermediate_size=int(f.key("expert_feed_forward_length")),
               n_shared_experts=int(f.get("expert_shared_count") or 0),
               norm_topk_prob=bool(f.get("expert_weights_norm")),
               routed_scaling_factor=f.decimal("expert_weights_scale", 1.0))  # 0: none
    layers = cfg["num_hidden_layers"]
    moe = sparse_mlp(cfg, tuple(range(int(f.get("leading_dense_block_count") or 0), layers)), grouped_softmax=True,
                     expert_groups=int(f.get("expert_group_count") or 1),
                     top_groups=int(f.get("expert_group_used_count") or 1))
    return with_file_ids(latent_config(cfg, ARCHITECTURE, moe, interleaved=True), fields, GGUF_ARCHITECTURE)

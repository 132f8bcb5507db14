"""Databricks' DBRX (dbrx-base, dbrx-instruct: 132B, 36B active; ``DbrxForCausalLM``, ``dbrx``): Llama's attention
(q, k and v fused in ``Wqkv``, clamped to ``[-clip_qkv, clip_qkv]``: ``ModelConfig.clip_qkv``) with LayerNorms
without a bias (epsilon 1e-5, ``nn.LayerNorm``'s), experts on every layer chosen by the softmax's top-k,
renormalised where ``moe_normalize_expert_weights`` is 1 (their sum; another norm refused by name); served by
:mod:`services.engine.model.dbrx_decoder`, which reads the released names (``transformer.blocks.N.*``, the experts
stacked as ``w1``/``v1``/``w2``). ``config.json`` (its nested ``attn_config`` and ``ffn_config``) is completed with
``DbrxConfig``'s defaults; an activation other than SiLU is refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "dbrx"
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import DbrxConfig

    full = with_defaults(ARCHITECTURE, DbrxConfig, cfg)
    attn, ffn = full["attn_config"], full["ffn_config"]
    activation = (ffn.get("ffn_act_fn") or {}).get("name", "silu")
    if activation != "silu":
        raise ModelLoadError(f"{ARCHITECTURE}: ffn_act_fn {activation!r} is not supported (only 'silu')")
    norm = ffn.get("moe_normalize_expert_weights")
    if norm not in (None, 1, 1.0):
        raise ModelLoadError(f"{ARCHITECTURE}: moe_normalize_expert_weights {norm} is not supported (only 1, the "
                             "top-k weights over their sum, or none)")
    width = int(ffn["ffn_hidden_size"])
    fields = base_fields({"hidden_size": full["d_model"], "num_attention_heads": full["n_heads"],
                          "num_key_value_heads": attn["kv_n_heads"], "num_hidden_layers": full["n_layers"],
                          "max_position_embeddings": full["max_seq_len"], "vocab_size": full["vocab_size"],
                          "intermediate_size": width, "rope_parameters": full.get("rope_parameters"),
                          "rms_norm_eps": LAYER_NORM_EPS, "tie_word_embeddings": full.get("tie_word_embeddings"),
                          "bos_token_id": full.get("bos_token_id"), "eos_token_id": full.get("eos_token_id"),
                          "_name_or_path": full.get("_name_or_path")}, ARCHITECTURE)
    moe = MoEConfig(num_experts=int(ffn["moe_num_experts"]), top_k=int(ffn["moe_top_k"]), intermediate_size=width,
                    norm_topk_prob=norm is not None, sparse_layers=tuple(range(fields["num_layers"])))
    clip = attn.get("clip_qkv")
    return ModelConfig(**fields, layer_norm=True, moe=moe, clip_qkv=None if clip is None else float(clip))

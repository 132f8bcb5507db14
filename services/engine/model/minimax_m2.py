"""MiniMax-M2, M2.1 and M2.5 (``MiniMaxM2ForCausalLM``, ``minimax_m2``; 230B-A10B): Llama's layer with

- q and k each normed over all their heads at once before rope (``q_norm`` of ``heads * head_dim``:
  :attr:`~services.engine.model.config.ModelConfig.qk_norm_whole`);
- rope on the leading ``rotary_dim`` dims of each head (64 of 128; the released configs' own key, which transformers
  reads as ``partial_rotary_factor``);
- experts on every layer, routed by the sigmoid of the router's logits: chosen by score plus
  ``e_score_correction_bias``, weighted by the scores alone and renormalised, no groups and no scaling
  (:attr:`~services.engine.model.config.MoEConfig.sigmoid_routing`); the router's weight, its bias and its logits are
  float32, as vLLM's are (a bf16 transformers load rounds all three to bf16, which can choose other experts, so bf16
  runs follow vLLM's routing, not bf16 transformers'); each expert ``intermediate_size`` wide, no shared expert.

Its checkpoints name the MLP ``block_sparse_moe`` with Mixtral's ``w1``/``w3``/``w2`` and keep the correction bias on
the block; the official files are FP8 with block scales (:mod:`services.engine.weights.fp8_blocks`). The
multi-token-prediction layers after the last are not read. A ``scoring_func`` other than sigmoid, a shared expert
or another ``qk_norm_type`` is refused by name.

llama.cpp's ``minimax-m2`` GGUF files (:func:`config_from_gguf`) hold the same layer unpermuted (its rope is NEOX's, on
halves of the rotated part): ``rope.dimension_count`` the rotated dims, ``expert_gating_func`` the sigmoid (another is
refused), the correction bias ``exp_probs_b``; llama.cpp renormalises the chosen weights and scales them by nothing,
as the checkpoints do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import (
    SIGMOID_GATING,
    GGUFFields,
    gguf_base_fields,
    gguf_turn_end_ids,
    require_gating,
)
from services.engine.model.hf_config import base_fields, required, rotary_dim
from services.engine.model.mixtral import mixtral_tensor_name

ARCHITECTURE = "minimax_m2"
GGUF_ARCHITECTURE = "minimax-m2"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"rope_theta": 5000000.0, "head_dim": 128, **{k: v for k, v in cfg.items() if v is not None}}
    for key, supported in (("scoring_func", "sigmoid"), ("qk_norm_type", "per_layer")):
        if cfg.get(key, supported) != supported:
            raise ModelLoadError(f"minimax_m2: {key} {cfg[key]!r} is not supported (only {supported!r})")
    if int(cfg.get("shared_intermediate_size") or 0) or int(cfg.get("n_shared_experts") or 0):
        raise ModelLoadError("minimax_m2: a shared expert (shared_intermediate_size) is not supported")
    if cfg.get("rotary_dim") is not None and rotary_dim(cfg, int(cfg["head_dim"])) is None:  # the released key
        cfg["partial_rotary_factor"] = int(cfg["rotary_dim"]) / int(cfg["head_dim"])
    fields = base_fields(cfg, ARCHITECTURE, partial_rotary=True)
    moe = MoEConfig(num_experts=int(required(cfg, "num_local_experts")),
                    top_k=int(required(cfg, "num_experts_per_tok")), intermediate_size=fields["intermediate_size"],
                    norm_topk_prob=True,
                    sparse_layers=tuple(range(fields["num_layers"])), sigmoid_routing=True)
    return ModelConfig(**fields, qk_norm=True, qk_norm_whole=True, moe=moe)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    require_gating(f, SIGMOID_GATING, "MiniMax-M2")
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    head_dim = int(f.get("attention.key_length") or base["hidden_size"] // base["num_heads"])
    rotary = int(f.get("rope.dimension_count") or head_dim)
    width = int(f.get("expert_feed_forward_length") or f.key("feed_forward_length"))
    moe = MoEConfig(num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
                    intermediate_size=width, norm_topk_prob=True, sparse_layers=tuple(range(base["num_layers"])),
                    sigmoid_routing=True)
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "head_dim": head_dim, "intermediate_size": width,
                          "rotary_dim": None if rotary == head_dim else rotary,
                          "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       qk_norm=True, qk_norm_whole=True, moe=moe)


def minimax_m2_tensor_name(name: str) -> str:
    """A MiniMax-M2 checkpoint tensor's name in the shared decoder (Mixtral's expert names; the block's correction
    bias is the router's)."""
    return mixtral_tensor_name(name).replace(".block_sparse_moe.e_score_correction_bias",
                                             ".mlp.gate.e_score_correction_bias")

"""AllenAI's OLMoE (OLMoE-1B-7B; ``OlmoeForCausalLM``, ``olmoe``): Llama's pre-norm layer with

- q and k each normed over all their heads at once before rope (``q_norm`` of ``heads * head_dim``, as OLMo 2's:
  :attr:`~services.engine.model.config.ModelConfig.qk_norm_whole`);
- experts on every layer, routed as Qwen-MoE's: the softmax of the router's logits over all experts, the top-k of
  it, renormalised only with ``norm_topk_prob`` (off in the released checkpoints); no shared expert.

Its checkpoints name the MLP as Qwen-MoE's (``mlp.gate``, ``mlp.experts.{e}.gate_proj|up_proj|down_proj``).
``clip_qkv`` (null in the released checkpoints) is refused by name.

llama.cpp's ``olmoe`` GGUF files (:func:`config_from_gguf`) hold the layer unpermuted (NEOX's rope), the experts
``feed_forward_length`` wide; llama.cpp routes them unrenormalised whatever the checkpoint said (its released
``norm_topk_prob`` is false), and so does pdserve for a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, required

ARCHITECTURE = GGUF_ARCHITECTURE = "olmoe"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"rms_norm_eps": 1e-5, **cfg}  # OlmoeConfig's default
    if cfg.get("clip_qkv") is not None:
        raise ModelLoadError(f"olmoe: clip_qkv {cfg['clip_qkv']!r} is not supported (only null, as released)")
    fields = base_fields(cfg, ARCHITECTURE)
    moe = olmoe_experts(cfg, fields["intermediate_size"], fields["num_layers"])
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_whole=True, moe=moe)


def olmoe_experts(cfg: Mapping[str, Any], width: int, layers: int) -> MoEConfig:
    """OLMoE's experts (``width`` wide) on every one of ``layers``: the softmax over all, its top-k, renormalised
    only with ``norm_topk_prob``."""
    return MoEConfig(num_experts=int(required(cfg, "num_experts")), top_k=int(required(cfg, "num_experts_per_tok")),
                     intermediate_size=width, norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                     sparse_layers=tuple(range(layers)))


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    width = int(f.get("expert_feed_forward_length") or f.key("feed_forward_length"))
    moe = MoEConfig(num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
                    intermediate_size=width, norm_topk_prob=False, sparse_layers=tuple(range(base["num_layers"])))
    return ModelConfig(**{**base, "intermediate_size": width, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       qk_norm=True, qk_norm_whole=True, moe=moe)

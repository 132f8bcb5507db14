"""Tencent's Hunyuan dense models (Hunyuan-0.5B to 7B, Hunyuan-MT-7B; ``HunYuanDenseV1ForCausalLM``,
``hunyuan_v1_dense``): Llama's layer with q and k RMSNormed head by head *after* rope (``query_layernorm``,
``key_layernorm``; ``ModelConfig.qk_norm_after_rope``), and their rope's NTK-alpha scaling, which the checkpoints call
``dynamic`` but with a fixed ``alpha`` only stretches the base (``rope_theta · alpha ** (d / (d - 2))``, as
transformers computes it): served as plain rope of that base. A ``dynamic`` rope without ``alpha`` (whose frequencies
follow the sequence's length) is refused by name. ``config.json`` is completed with transformers'
``HunYuanDenseV1Config`` defaults. Hunyuan-A13B (``HunYuanMoEV1ForCausalLM``, ``hunyuan_v1_moe``) is the same layer
with experts (:func:`_moe`).

llama.cpp's ``hunyuan-dense`` GGUF files (:func:`config_from_gguf`): its converter folds the alpha into
``rope.freq_base`` (as float32); nothing permuted (NEOX's rope, on halves), the norms after rope as its graph runs
them, q/k/v biases where the file holds them. Its ``hunyuan-moe`` files (Hunyuan-A13B's) too: the experts
``feed_forward_length`` wide (as llama.cpp's loader makes them), the shared MLP ``expert_shared_feed_forward_length``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "hunyuan"
MODEL_TYPE = "hunyuan_v1_dense"
MOE_MODEL_TYPE = "hunyuan_v1_moe"
GGUF_ARCHITECTURE = "hunyuan-dense"
GGUF_MOE_ARCHITECTURE = "hunyuan-moe"


def ntk_alpha_base(theta: float, alpha: float, head_dim: int) -> float:
    """The rope base an NTK-alpha scaling of ``alpha`` gives (transformers' ``compute_ntk_alpha_rope_parameters``)."""
    return theta * alpha ** (head_dim / (head_dim - 2))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import HunYuanDenseV1Config, HunYuanMoEV1Config

    if cfg.get("model_type") == MOE_MODEL_TYPE:
        return _moe(with_defaults(MOE_MODEL_TYPE, HunYuanMoEV1Config, cfg))
    return _dense(with_defaults(MODEL_TYPE, HunYuanDenseV1Config, cfg))


def _moe(full: Mapping[str, Any]) -> ModelConfig:
    """Hunyuan-A13B's: the dense model's layer with experts on every layer (as transformers' ``HunYuanMoEV1`` runs
    them: ``intermediate_size`` wide, the float32 softmax's top-k renormalised) beside an ungated shared MLP of the same
    width; a count of experts or a top-k that differs by layer is refused by name."""
    dense = _dense(full)
    per_layer = {key: full[key] if isinstance(full[key], list) else [full[key]] for key in ("num_experts", "moe_topk")}
    if any(len(set(values)) != 1 for values in per_layer.values()):
        raise ModelLoadError(f"{MOE_MODEL_TYPE}: num_experts {full['num_experts']} and moe_topk {full['moe_topk']} "
                             "must be one value for every layer")
    moe = MoEConfig(num_experts=int(per_layer["num_experts"][0]), top_k=int(per_layer["moe_topk"][0]),
                    intermediate_size=dense.intermediate_size, norm_topk_prob=True,
                    sparse_layers=tuple(range(dense.num_layers)), group_limited_softmax=True,
                    shared_expert_intermediate_size=dense.intermediate_size, shared_expert_gated=False)
    return dataclasses.replace(dense, moe=moe)


def _dense(full: Mapping[str, Any]) -> ModelConfig:
    if full.get("use_cla"):  # Hunyuan-Large's cross-layer attention, which transformers' dense model does not run
        raise ModelLoadError(f"{MODEL_TYPE}: use_cla is not supported (KV shared across layers)")
    params = dict(full.get("rope_parameters") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    head_dim = int(full.get("head_dim") or int(full["hidden_size"]) // int(full["num_attention_heads"]))
    theta = float(params.get("rope_theta") or 10000.0)
    if rope_type == "dynamic":
        if not params.get("alpha"):
            raise ModelLoadError(f"{MODEL_TYPE}: a dynamic rope without alpha is not supported (its frequencies follow "
                                 "the sequence's length)")
        theta = ntk_alpha_base(theta, float(params["alpha"]), head_dim)
    elif rope_type != "default":
        raise ModelLoadError(f"{MODEL_TYPE}: rope type {rope_type!r} is not supported (default, or dynamic with alpha)")
    fields = base_fields({**full, "head_dim": head_dim, "rope_parameters": {"rope_type": "default",
                                                                           "rope_theta": theta}}, ARCHITECTURE)
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_after_rope=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    arch = str(fields.get("general.architecture"))
    f = GGUFFields(fields, arch)
    base = gguf_base_fields(fields, arch)
    moe = None
    if arch == GGUF_MOE_ARCHITECTURE:  # as llama.cpp's loader reads it: every expert feed_forward_length wide
        width = base["intermediate_size"]
        moe = MoEConfig(num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
                        intermediate_size=width, norm_topk_prob=True, sparse_layers=tuple(range(base["num_layers"])),
                        group_limited_softmax=True, shared_expert_gated=False,
                        shared_expert_intermediate_size=int(f.get("expert_shared_feed_forward_length") or width))
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       qkv_bias=f.has_tensor(".attn_q.bias"), o_bias=f.has_tensor(".attn_output.bias"),
                       qk_norm=True, qk_norm_after_rope=True, moe=moe)


def hunyuan_tensor_name(name: str) -> str:
    """A checkpoint tensor's name in the shared decoder: the q/k norms as ``q_norm``/``k_norm``; Hunyuan-A13B's router
    (``mlp.gate.wg``) and shared MLP (``mlp.shared_mlp``) as the shared decoder's."""
    return name.replace(".self_attn.query_layernorm.", ".self_attn.q_norm.").replace(
        ".self_attn.key_layernorm.", ".self_attn.k_norm.").replace(".mlp.gate.wg.", ".mlp.gate.").replace(
        ".mlp.shared_mlp.", ".mlp.shared_expert.")

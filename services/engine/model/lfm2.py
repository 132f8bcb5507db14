"""Liquid AI's LFM2 (LFM2-350M, -700M, -1.2B, -2.6B and their fine-tunes) and LFM2-MoE (``lfm2_moe``: LFM2-8B-A1B):
a hybrid decoder whose layers are mostly gated short convolutions (a depthwise causal convolution of ``conv_L_cache``
taps, its last inputs a recurrent state per request; :mod:`services.engine.model.lfm2_decoder`) and a few attention
layers (``layer_types``, or ``full_attn_idxs`` in the first releases' configs).

Each layer is ``h += mix(norm(h))`` then ``h += mlp(norm(h))``. The attention layers are Qwen3's (per-head q/k
RMS norms, full rope), without biases. The MLP is SwiGLU with the width transformers derives from ``block_ff_dim``
(``block_auto_adjust_ff_dim``: two thirds of it, times ``block_ffn_dim_multiplier``, rounded up to
``block_multiple_of``). The checkpoint's names are read as Llama's where they mean the same
(``operator_norm``, ``ffn_norm``, ``feed_forward.w1/w3/w2``, ``out_proj``, ``q_layernorm``; the final
``embedding_norm``).

LFM2-MoE's MLP is dense (``intermediate_size`` wide) on its first ``num_dense_layers`` layers, sparse on the rest:
experts ``moe_intermediate_size`` wide (``feed_forward.experts.{e}.w1/w3/w2``), chosen by the sigmoid of the router's
logits plus ``expert_bias`` (the choice only), weighted by the sigmoid, renormalised (+1e-6, as transformers) and
times ``routed_scaling_factor`` (``MoEConfig.sigmoid_routing``; the router runs in float32, as every sigmoid router
here does).

LFM3 (``lfm3``: LFM3-1.7B) adds sliding-window attention layers (``sliding_attention`` in ``layer_types``, 256 wide)
that rotate with a plain rope of their own base beside the full layers' proportional rope on half of each head, a
norm on each block's output (``use_sandwich_norm``: ``post_operator_norm``, ``post_ffn_norm``) and a sigmoid gate
per attention head from the layer's normed input (``use_attention_gate``: ``self_attn.gate_proj``); its MLP is
``intermediate_size`` wide as is. ``config.json`` is completed with ``Lfm3Config``'s defaults.

llama.cpp's GGUF files of both (``lfm2``, ``lfm2moe``: Liquid AI's own releases are GGUF) are read too
(:func:`config_from_gguf`; the final norm is their ``token_embd_norm``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig, ShortConv, windowed_layers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields
from services.engine.model.hf_config import base_fields, required, rope_settings, typed_layer_windows, with_defaults

ARCHITECTURE = "lfm2"
MOE_TYPE = "lfm2_moe"
LFM3_TYPE = "lfm3"
GGUF_MOE = "lfm2moe"
LAYER_KINDS = ("conv", "full_attention")
_RENAMES = (
    # LFM3's (its head gate released as self_attn.gate_proj, transformers' g_proj)
    (".post_operator_norm.", ".post_self_attn_layernorm."), (".post_ffn_norm.", ".post_mlp_layernorm."),
    (".self_attn.gate_proj.", ".self_attn.g_proj."),
    (".operator_norm.", ".input_layernorm."), (".ffn_norm.", ".post_attention_layernorm."),
    (".feed_forward.w1.", ".mlp.gate_proj."), (".feed_forward.w3.", ".mlp.up_proj."),
    (".feed_forward.w2.", ".mlp.down_proj."), (".self_attn.out_proj.", ".self_attn.o_proj."),
    (".self_attn.q_layernorm.", ".self_attn.q_norm."), (".self_attn.k_layernorm.", ".self_attn.k_norm."),
)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Lfm2Config, Lfm2MoeConfig

    if cfg.get("model_type") == LFM3_TYPE:
        return _lfm3_config(cfg)
    is_moe = cfg.get("model_type") == MOE_TYPE
    if is_moe:
        full = with_defaults(ARCHITECTURE, Lfm2MoeConfig, cfg)  # reads tie_embedding
        width = int(full["intermediate_size"])
    else:
        full = with_defaults(ARCHITECTURE, Lfm2Config, cfg)  # reads block_ff_dim, tie_embedding, full_attn_idxs
        width = _mlp_width(full)
    fields = base_fields({**full, "intermediate_size": width, "rms_norm_eps": full["norm_eps"]}, ARCHITECTURE)
    kinds = list(full.get("layer_types") or [])
    if len(kinds) != fields["num_layers"] or set(kinds) - set(LAYER_KINDS):
        raise ModelLoadError(f"{ARCHITECTURE}: layer_types must list {fields['num_layers']} of "
                             f"{', '.join(LAYER_KINDS)}, got {kinds}")
    if full.get("conv_bias"):
        raise ModelLoadError(f"{ARCHITECTURE}: conv_bias is not supported (no release has it)")
    if "full_attention" not in kinds:
        raise ModelLoadError(f"{ARCHITECTURE}: layer_types has no attention layer (a convolution-only model is not "
                             "served)")
    conv = ShortConv(layers=tuple(i for i, kind in enumerate(kinds) if kind == "conv"),
                     conv_dim=fields["hidden_size"], conv_kernel=int(full["conv_L_cache"]))
    moe = _experts(full, fields["num_layers"]) if is_moe else None
    return ModelConfig(**fields, qk_norm=True, short_conv=conv if conv.layers else None, moe=moe)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``lfm2`` or ``lfm2moe`` file's config, read as llama.cpp reads it: a layer is attention where its
    ``attention.head_count_kv`` (one per layer) is not 0, else a convolution of ``shortconv.l_cache`` taps; the MLP
    as wide as ``feed_forward_length`` (the converter writes the width transformers derives); LFM2-MoE's experts
    on the layers after ``leading_dense_block_count``, routed as the safetensors' (sigmoid, its correction bias,
    renormalised)."""
    arch = str(fields.get("general.architecture"))
    f = GGUFFields(fields, arch)
    per_layer = f.key("attention.head_count_kv")
    layers = int(f.key("block_count"))
    kv_heads = [int(n) for n in per_layer] if isinstance(per_layer, list | tuple) else [int(per_layer)] * layers
    if len(kv_heads) != layers or not any(kv_heads):
        raise ModelLoadError(f"GGUF {arch}: attention.head_count_kv must give {layers} layers, some of them "
                             f"attention (not 0); got {per_layer}")
    base = gguf_base_fields({**fields, f"{arch}.attention.head_count_kv": max(kv_heads)}, arch)
    conv = ShortConv(layers=tuple(i for i, n in enumerate(kv_heads) if not n), conv_dim=base["hidden_size"],
                     conv_kernel=int(f.key("shortconv.l_cache")))
    moe = None
    if arch == GGUF_MOE:
        moe = MoEConfig(num_experts=int(f.key("expert_count")), top_k=int(f.key("expert_used_count")),
                        intermediate_size=int(f.key("expert_feed_forward_length")), norm_topk_prob=True,
                        sparse_layers=tuple(range(int(f.get("leading_dense_block_count") or 0), layers)),
                        sigmoid_routing=True, norm_epsilon=1e-6)
    return ModelConfig(**{**base, "architecture": ARCHITECTURE}, qk_norm=True,
                       short_conv=conv if conv.layers else None, moe=moe)


def _lfm3_config(cfg: Mapping[str, Any]) -> ModelConfig:
    """LFM3's config (``Lfm3Config``'s defaults where a file lacks a key): LFM2's layers with sliding attention layers
    beside the full ones, each kind with its rope (the full layers' proportional, on half the head), sandwich norms
    and a sigmoid gate per attention head."""
    from transformers import Lfm3Config

    full = with_defaults(LFM3_TYPE, Lfm3Config, cfg)
    for key in ("conv_bias", "attention_bias"):
        if full.get(key):
            raise ModelLoadError(f"{LFM3_TYPE}: {key} is not supported (no release has it)")
    kinds = list(full.get("layer_types") or [])
    layers = int(full["num_hidden_layers"])
    if len(kinds) != layers or set(kinds) - {*LAYER_KINDS, "sliding_attention"}:
        raise ModelLoadError(f"{LFM3_TYPE}: layer_types must list {layers} of conv, full_attention, "
                             f"sliding_attention; got {kinds}")
    if not set(kinds) - {"conv"}:
        raise ModelLoadError(f"{LFM3_TYPE}: layer_types has no attention layer (a convolution-only model is not "
                             "served)")
    ropes = full["rope_parameters"]
    local_theta = None
    if "sliding_attention" in kinds:
        local_theta, local_scaling = rope_settings({"rope_parameters": ropes.get("sliding_attention") or {}})
        if local_scaling is not None:
            raise ModelLoadError(f"{LFM3_TYPE}: the sliding layers' rope must be plain, got "
                                 f"{ropes['sliding_attention']}")
    fields = base_fields({**full, "rms_norm_eps": full["norm_eps"], "rope_parameters": ropes["full_attention"]},
                         ARCHITECTURE)
    attention_kinds = [kind if kind != "conv" else "full_attention" for kind in kinds]  # a convolution: no window
    windows = typed_layer_windows(LFM3_TYPE, attention_kinds, layers, full.get("sliding_window"))
    conv = ShortConv(layers=tuple(i for i, kind in enumerate(kinds) if kind == "conv"),
                     conv_dim=fields["hidden_size"], conv_kernel=int(full["conv_L_cache"]))
    return ModelConfig(**fields, qk_norm=True, short_conv=conv if conv.layers else None,
                       layer_windows=windows if any(windows) else (), local_rope_layers=windowed_layers(windows),
                       local_rope_theta=local_theta, sandwich_norms=bool(full.get("use_sandwich_norm")),
                       attention_head_gate=bool(full.get("use_attention_gate")), rope_in_float32=True)


def _experts(full: Mapping[str, Any], num_layers: int) -> MoEConfig:
    """LFM2-MoE's sparse layers (all but the first ``num_dense_layers``) and their routing."""
    if not full.get("use_expert_bias", True):
        raise ModelLoadError(f"{MOE_TYPE}: use_expert_bias false is not supported (no release has it)")
    dense = int(full.get("num_dense_layers") or 0)
    return MoEConfig(num_experts=int(required(full, "num_experts")), top_k=int(required(full, "num_experts_per_tok")),
                     intermediate_size=int(required(full, "moe_intermediate_size")),
                     norm_topk_prob=bool(full.get("norm_topk_prob", True)),
                     sparse_layers=tuple(range(dense, num_layers)), sigmoid_routing=True,
                     routed_scaling=float(full.get("routed_scaling_factor") or 1.0), norm_epsilon=1e-6)


def _mlp_width(full: Mapping[str, Any]) -> int:
    """The SwiGLU width transformers' ``Lfm2MLP`` builds."""
    width = int(full["intermediate_size"])
    if full.get("block_auto_adjust_ff_dim"):
        width = int(2 * width / 3)
        if full.get("block_ffn_dim_multiplier") is not None:
            width = int(full["block_ffn_dim_multiplier"] * width)
            multiple = int(full["block_multiple_of"])
            width = multiple * ((width + multiple - 1) // multiple)
    return width


_EXPERT_RENAMES = ((".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj."))


def lfm2_tensor_name(name: str) -> str:
    """A checkpoint tensor's name as the shared decoder reads it (the convolutions' keep theirs)."""
    if name == "model.embedding_norm.weight":
        return "model.norm.weight"
    if ".feed_forward.experts." in name:  # LFM2-MoE's experts (per expert, or transformers 5's stacked ones)
        name = name.replace(".feed_forward.experts.", ".mlp.experts.")
        for old, new in _EXPERT_RENAMES:
            name = name.replace(old, new)
        return name
    if name.endswith(".feed_forward.expert_bias"):
        return name.replace(".feed_forward.expert_bias", ".mlp.gate.e_score_correction_bias")
    if ".feed_forward.gate." in name:
        return name.replace(".feed_forward.gate.", ".mlp.gate.")
    for old, new in _RENAMES:
        if old in name:
            return name.replace(old, new)
    return name

"""Liquid AI's LFM2 (LFM2-350M, -700M, -1.2B, -2.6B and their fine-tunes): a hybrid decoder whose layers are mostly
gated short convolutions (a depthwise causal convolution of ``conv_L_cache`` taps, its last inputs a recurrent state
per request; :mod:`services.engine.model.lfm2_decoder`) and a few attention layers (``layer_types``, or
``full_attn_idxs`` in the first releases' configs).

Each layer is ``h += mix(norm(h))`` then ``h += mlp(norm(h))``. The attention layers are Qwen3's (per-head q/k
RMS norms, full rope), without biases. The MLP is SwiGLU with the width transformers derives from ``block_ff_dim``
(``block_auto_adjust_ff_dim``: two thirds of it, times ``block_ffn_dim_multiplier``, rounded up to
``block_multiple_of``). The checkpoint's names are read as Llama's where they mean the same
(``operator_norm``, ``ffn_norm``, ``feed_forward.w1/w3/w2``, ``out_proj``, ``q_layernorm``; the final
``embedding_norm``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, ShortConv
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "lfm2"
LAYER_KINDS = ("conv", "full_attention")
_RENAMES = (
    (".operator_norm.", ".input_layernorm."), (".ffn_norm.", ".post_attention_layernorm."),
    (".feed_forward.w1.", ".mlp.gate_proj."), (".feed_forward.w3.", ".mlp.up_proj."),
    (".feed_forward.w2.", ".mlp.down_proj."), (".self_attn.out_proj.", ".self_attn.o_proj."),
    (".self_attn.q_layernorm.", ".self_attn.q_norm."), (".self_attn.k_layernorm.", ".self_attn.k_norm."),
)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Lfm2Config

    full = with_defaults(ARCHITECTURE, Lfm2Config, cfg)  # reads block_ff_dim, tie_embedding, full_attn_idxs
    fields = base_fields({**full, "intermediate_size": _mlp_width(full), "rms_norm_eps": full["norm_eps"]},
                         ARCHITECTURE)
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
    return ModelConfig(**fields, qk_norm=True, short_conv=conv if conv.layers else None)


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


def lfm2_tensor_name(name: str) -> str:
    """A checkpoint tensor's name as the shared decoder reads it (the convolutions' keep theirs)."""
    if name == "model.embedding_norm.weight":
        return "model.norm.weight"
    for old, new in _RENAMES:
        if old in name:
            return name.replace(old, new)
    return name

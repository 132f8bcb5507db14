"""Xiaomi's MiMo-V2-Flash (``MiMoV2FlashForCausalLM``, ``mimo_v2_flash``; 309B-A15B): sliding-window layers (by
default five of every six, a window of ``sliding_window``) around full ones, with MiMo's attention
(:mod:`services.engine.model.mimo_decoder`: twice the KV heads on the sliding layers, values narrower than the keys
and scaled by ``attention_value_scale``, sinks on the sliding layers, rope over the leading third of each head with a
base per kind of layer), and DeepSeek-V3's experts without a shared one on the layers ``mlp_layer_types`` calls sparse
(the sigmoid with the correction bias, within the best groups). ``config.json`` is completed with transformers'
``MiMoV2FlashConfig``; the multi-token-prediction layers (``model.mtp.*``) are not read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import MiMoAttention, ModelConfig, windowed_layers
from services.engine.model.deepseek import sparse_mlp
from services.engine.model.hf_config import (
    sparse_mlp_layers,
    typed_layer_windows,
    typed_ropes,
    with_defaults,
)

ARCHITECTURE = "mimo_v2_flash"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import MiMoV2FlashConfig

    full = with_defaults(ARCHITECTURE, MiMoV2FlashConfig, cfg)
    layers, kinds = int(full["num_hidden_layers"]), list(full["layer_types"])
    # a kind's rope without a partial_rotary_factor rotates a third of each head, as MiMo's rotary embedding reads it
    ropes = {kind: {"partial_rotary_factor": 0.334, **params} for kind, params in full["rope_parameters"].items()}
    fields, local_theta = typed_ropes({**full, "rope_parameters": ropes}, ARCHITECTURE, partial_rotary=True)
    windows = typed_layer_windows(ARCHITECTURE, kinds, layers, full.get("sliding_window"))
    kv = int(full["num_key_value_heads"])
    kv_heads = tuple(2 * kv if kind == "sliding_attention" else kv for kind in kinds)
    slot = max(kv_heads)
    if fields["num_heads"] % slot:
        raise ModelLoadError(f"{ARCHITECTURE}: {fields['num_heads']} query heads do not split over {slot} KV heads")
    scale = full.get("attention_value_scale")
    mimo = MiMoAttention(kv_heads=kv_heads, v_head_dim=int(full["v_head_dim"]),
                         value_scale=1.0 if scale is None else float(scale), sink_layers=windowed_layers(windows))
    moe = sparse_mlp({**full, "n_shared_experts": 0}, sparse_mlp_layers(full, layers, ARCHITECTURE),
                     sigmoid_routing=True, expert_groups=int(full.get("n_group") or 1),
                     top_groups=int(full.get("topk_group") or 1))
    return ModelConfig(**{**fields, "num_kv_heads": slot}, qkv_bias=bool(full.get("attention_bias")), moe=moe,
                       layer_windows=windows, local_rope_layers=windowed_layers(windows), local_rope_theta=local_theta,
                       attention_sinks=bool(mimo.sink_layers), mimo=mimo)


def mimo_tensor_name(name: str) -> str | None:
    """A MiMo-V2-Flash checkpoint tensor's name in the decoder (the sinks under GPT-OSS's name); None for the
    multi-token-prediction layers'."""
    if name.startswith("model.mtp."):
        return None
    return name.replace(".self_attn.attention_sink_bias", ".self_attn.sinks")

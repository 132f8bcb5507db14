"""Arcee's AFMoE (``AfmoeForCausalLM``, ``afmoe``: Trinity Nano, Mini and Large): a decoder of sliding-window layers
with rope and full layers without (``layer_types``: by default every ``global_attn_every_n_layers``-th full), each

- attention with per-head q/k RMSNorms and its output times the sigmoid of ``self_attn.gate_proj`` over the layer's
  normed input, value by value (``ModelConfig.attention_value_gate``);
- a norm on each block's output as well as before it (``post_attention_layernorm`` on the attention's,
  ``pre_mlp_layernorm`` before the MLP, ``post_mlp_layernorm`` on its output: the shared decoder's sandwich norms);
- a dense MLP on the first ``num_dense_layers`` layers, then experts routed by the sigmoid of float32 router logits
  chosen with ``expert_bias`` (the correction bias), no groups, renormalised and times ``route_scale``, beside
  ``num_shared_experts`` ungated shared experts.

``mup_enabled`` scales the embeddings by ``sqrt(hidden_size)``. The router is ``mlp.router.gate`` and the shared MLP
``mlp.shared_experts`` (read under the shared decoder's names). ``config.json`` is completed with transformers'
``AfmoeConfig``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig, MoEConfig, Multipliers
from services.engine.model.hf_config import base_fields, typed_layer_windows, with_defaults

ARCHITECTURE = "afmoe"

# checkpoint → shared decoder, in one pass (AFMoE's post_attention_layernorm is the attention's output norm, its
# pre_mlp_layernorm the norm the shared decoder calls post_attention_layernorm)
_NAMES = {"post_attention_layernorm": "post_self_attn_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
          "self_attn.gate_proj": "self_attn.g_proj", "mlp.router.gate": "mlp.gate",
          "mlp.expert_bias": "mlp.gate.e_score_correction_bias", "mlp.shared_experts": "mlp.shared_expert"}
_PATTERN = re.compile(r"\.(" + "|".join(re.escape(name) for name in _NAMES) + r")(?=\.|$)")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import AfmoeConfig

    full = with_defaults(ARCHITECTURE, AfmoeConfig, cfg)
    if full.get("attention_bias"):
        raise ModelLoadError(f"{ARCHITECTURE}: attention_bias is not supported (no release has it)")
    fields = base_fields(full, ARCHITECTURE)
    layers = fields["num_layers"]
    kinds = list(full["layer_types"])
    windows = typed_layer_windows(ARCHITECTURE, kinds, layers, full.get("sliding_window"))
    width = int(full["moe_intermediate_size"])
    moe = MoEConfig(num_experts=int(full["num_experts"]), top_k=int(full["num_experts_per_tok"]),
                    intermediate_size=width, norm_topk_prob=True,
                    sparse_layers=tuple(range(int(full.get("num_dense_layers") or 0), layers)),
                    shared_expert_intermediate_size=width * int(full.get("num_shared_experts") or 0) or None,
                    shared_expert_gated=False, sigmoid_routing=True, routed_scaling=float(full["route_scale"]))
    multipliers = Multipliers(embedding=fields["hidden_size"] ** 0.5) if full.get("mup_enabled") else None
    return ModelConfig(**fields, qk_norm=True, attention_value_gate=True, sandwich_norms=True, moe=moe,
                       layer_windows=windows if any(w is not None for w in windows) else (),
                       nope_layers=tuple(i for i in range(layers) if windows[i] is None),  # full layers: no rope
                       multipliers=multipliers)


def afmoe_tensor_name(name: str) -> str:
    """An AFMoE checkpoint tensor's name in the shared decoder."""
    return _PATTERN.sub(lambda match: "." + _NAMES[match.group(1)], name)

"""AllenAI's OLMo 2 (1B, 7B, 13B, 32B; ``Olmo2ForCausalLM``, ``olmo2``): Llama's projections and rope in another
layer (:class:`Olmo2DecoderModel`):

- no norm before attention or the MLP: each block's output is normed before it joins the residual stream
  (``post_attention_layernorm``, ``post_feedforward_layernorm``);
- q and k normed over all their heads at once (``q_norm`` of ``heads * head_dim``), before they split into heads
  and rotate.

OLMo 3 (``olmo3``, :mod:`services.engine.model.olmo3`) adds sliding layers with their own rope;
OLMoE (:mod:`services.engine.model.olmoe`) keeps Llama's pre-norm layer with these q/k norms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields

ARCHITECTURE = "olmo2"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"rms_norm_eps": 1e-5, **cfg}  # Olmo2Config's default
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base_fields(cfg, ARCHITECTURE), qkv_bias=bias, o_bias=bias)

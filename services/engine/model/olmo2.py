"""AllenAI's OLMo 2 (1B, 7B, 13B, 32B; ``Olmo2ForCausalLM``, ``olmo2``): Llama's projections and rope in another
layer (:class:`Olmo2DecoderModel`):

- no norm before attention or the MLP: each block's output is normed before it joins the residual stream
  (``post_attention_layernorm``, ``post_feedforward_layernorm``);
- q and k normed over all their heads at once (``q_norm`` of ``heads * head_dim``), before they split into heads
  and rotate.

OLMo 3 (``olmo3``, :mod:`services.engine.model.olmo3`) adds sliding layers with their own rope;
OLMoE (:mod:`services.engine.model.olmoe`) keeps Llama's pre-norm layer with these q/k norms.

llama.cpp's ``olmo2`` GGUF files (:func:`config_from_gguf`) hold OLMo 2's and OLMo 3's layers unpermuted (NEOX's rope,
on halves); an OLMo 3 file names its window (``attention.sliding_window``) and which layers slide
(``attention.sliding_window_pattern``, true for a sliding one; llama.cpp's older files: three of every four), whose
rope is plain over ``rope.freq_base_swa`` (else ``rope.freq_base``) while the full layers' carries the file's scaling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig, windowed_layers
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_sliding_layers, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields

ARCHITECTURE = GGUF_ARCHITECTURE = "olmo2"
OLMO3 = "olmo3"
_GGUF_SLIDING_PERIOD = 4  # llama.cpp's pattern where a file with a window names none: the fourth layer is full


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"rms_norm_eps": 1e-5, **cfg}  # Olmo2Config's default
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(**base_fields(cfg, ARCHITECTURE), qkv_bias=bias, o_bias=bias, rope_in_float32=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """OLMo 2's config, or OLMo 3's where the file names a window."""
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    base["eos_token_ids"] = gguf_turn_end_ids(base, fields)
    window = int(f.get("attention.sliding_window") or 0)
    if not window:
        return ModelConfig(**base, rope_in_float32=True)
    windows = gguf_sliding_layers(f, base["num_layers"], window, _GGUF_SLIDING_PERIOD)
    return ModelConfig(**{**base, "architecture": OLMO3}, layer_windows=windows,
                       local_rope_layers=windowed_layers(windows),
                       local_rope_theta=float(f.get("rope.freq_base_swa") or base["rope_theta"]))

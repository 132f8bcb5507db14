"""GLM-4-0414 (GLM-4-9B-0414, GLM-4-32B-0414 and their GLM-Z1 reasoning twins; ``Glm4ForCausalLM``, ``glm4``):
Llama's decoder with

- rope on pairs of adjacent dims (``ModelConfig.rope_interleaved``; transformers' GLM-4 rotates ``x[2i]`` with
  ``x[2i + 1]``) over the first half of each head (``partial_rotary_factor``, 0.5 where absent, as
  ``Glm4Config`` reads it);
- a norm on each block's output before it joins the residual stream (``post_self_attn_layernorm``,
  ``post_mlp_layernorm``: ``ModelConfig.sandwich_norms``), besides the two before the blocks;
- q/k/v biases (``attention_bias``, true where absent) and gate/up stored as one ``gate_up_proj``.

GLM-4-9B-Chat (``chatglm``, the 2024 release with its own remote code) is not this family.

llama.cpp's ``glm4`` GGUF files (:func:`config_from_gguf`) hold the same tensors (the four norms as ``attn_norm``,
``post_attention_norm``, ``ffn_norm``, ``post_ffw_norm``; ``ffn_up`` the fused gate/up; nothing permuted: its rope is
on adjacent pairs, as transformers' GLM-4 rotates them); the head from ``attention.key_length`` (else hidden /
heads), its rotated part ``rope.dimension_count``; q/k/v biases as the file has them; ``<|user|>`` and
``<|observation|>`` end a turn (its converter writes the first as ``eot_token_id`` only). The text files of GLM-4.1V
and GLM-4.6V (also ``glm4``, with ``rope.dimension_sections``: their q/k rotated parts reordered for M-RoPE) are
refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import GGUFFields, gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields

ARCHITECTURE = GGUF_ARCHITECTURE = "glm4"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    cfg = {"partial_rotary_factor": 0.5, "head_dim": 128, "rms_norm_eps": 1.5625e-07, **cfg}  # Glm4Config's
    fields = base_fields(cfg, ARCHITECTURE, partial_rotary=True)
    return ModelConfig(**fields, qkv_bias=bool(cfg.get("attention_bias", True)), rope_interleaved=True,
                       sandwich_norms=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    if f.get("rope.dimension_sections") is not None:
        raise ModelLoadError("GGUF glm4: a file with rope.dimension_sections (the text model of GLM-4.1V or "
                             "GLM-4.6V, whose converter reorders the rotated part of q and k for M-RoPE) is not served")
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    head_dim = int(f.get("attention.key_length") or base["hidden_size"] // base["num_heads"])
    rotary = int(f.key("rope.dimension_count"))
    return ModelConfig(**{**base, "head_dim": head_dim, "rotary_dim": None if rotary == head_dim else rotary,
                          "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       rope_interleaved=True, sandwich_norms=True)

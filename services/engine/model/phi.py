"""Microsoft's Phi-1, Phi-1.5 and Phi-2 (``PhiForCausalLM``, ``phi``): attention and the MLP side by side on one
LayerNorm a layer (``parallel_blocks``: :mod:`services.engine.model.layernorm_decoder`), biases on every projection
and the LM head, an ungated tanh-GELU MLP (``fc1``/``fc2``), rope on the leading ``partial_rotary_factor`` of each
head (Phi-2's 0.4), read as ``PhiConfig`` completes it (``layer_norm_eps``); its names (``self_attn.dense``,
``final_layernorm``) read as the shared decoder's (:func:`phi_tensor_name`). ``qk_layernorm`` (no release sets it)
and another ``hidden_act`` are refused by name. llama.cpp's ``phi2`` GGUF files too (:func:`config_from_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_layer_norm_fields
from services.engine.model.hf_config import base_fields, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = "phi"
GGUF_ARCHITECTURE = "phi2"
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # transformers' names of the tanh approximation

_NAMES = renames(((r"\.self_attn\.dense\.", ".self_attn.o_proj."), (r"\.mlp\.fc1\.", ".mlp.up_proj."),
                  (r"\.mlp\.fc2\.", ".mlp.down_proj."), (r"^model\.final_layernorm\.", "model.norm.")))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import PhiConfig

    full = with_defaults(ARCHITECTURE, PhiConfig, cfg)
    if full.get("hidden_act") not in _TANH_GELUS:
        raise ModelLoadError(f"phi: hidden_act {full.get('hidden_act')!r} is not supported (only "
                             f"{', '.join(_TANH_GELUS)})")
    if full.get("qk_layernorm"):
        raise ModelLoadError("phi: qk_layernorm is not supported (q and k LayerNormed head by head)")
    fields = base_fields({**full, "rms_norm_eps": full["layer_norm_eps"]}, ARCHITECTURE, check_mlp=False,
                         partial_rotary=True)
    return ModelConfig(**fields, qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True,
                       mlp_activation="gelu_tanh", layer_norm=True, parallel_blocks=True)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``phi2`` file's config, read as its loader reads it: the LayerNorms' epsilon
    (``attention.layer_norm_epsilon``), the rotated part ``rope.dimension_count``, biases on every projection and the
    head, nothing permuted (NEOX's rope, on halves)."""
    return ModelConfig(**{**gguf_layer_norm_fields(fields, GGUF_ARCHITECTURE), "architecture": ARCHITECTURE},
                       qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True, mlp_activation="gelu_tanh",
                       layer_norm=True, parallel_blocks=True)


def phi_tensor_name(name: str) -> str:
    """A Phi checkpoint tensor's name in the shared decoder."""
    return renamed(name, _NAMES)

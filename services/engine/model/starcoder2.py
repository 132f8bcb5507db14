"""BigCode's StarCoder2 (3B, 7B, 15B; ``Starcoder2ForCausalLM``, ``starcoder2``): Mistral's attention (a window on
every layer where ``sliding_window`` is set: 4096 in the releases, served exactly) with LayerNorms
(:mod:`services.engine.model.layernorm_decoder`), biases on every projection (``use_bias``), an ungated tanh-GELU MLP
``c_proj(gelu(c_fc(x)))`` (read as ``up_proj``/``down_proj``, :func:`starcoder2_tensor_name`), read as
``Starcoder2Config`` completes it (``norm_epsilon``; tied embeddings where unset). Another ``hidden_act`` is refused
by name. llama.cpp's ``starcoder2`` GGUF files too (:func:`config_from_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gemma3 import ACTIVATIONS
from services.engine.model.gguf_config import GGUFFields, gguf_layer_norm_fields
from services.engine.model.hf_config import base_fields, every_layer_window, with_defaults
from services.engine.model.tensor_renames import renamed, renames

ARCHITECTURE = GGUF_ARCHITECTURE = "starcoder2"

_MLP = renames(((r"\.mlp\.c_fc\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj.")))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import Starcoder2Config

    full = with_defaults(ARCHITECTURE, Starcoder2Config, cfg)
    if full.get("hidden_act") not in ACTIVATIONS:
        raise ModelLoadError(f"starcoder2: hidden_act {full.get('hidden_act')!r} is not supported "
                             f"(only {', '.join(ACTIVATIONS)})")
    fields = base_fields({**full, "rms_norm_eps": full["norm_epsilon"]}, ARCHITECTURE, check_mlp=False)
    bias = bool(full.get("use_bias"))
    return ModelConfig(**fields, qkv_bias=bias, o_bias=bias, mlp_bias=bias, mlp_activation="gelu_tanh",
                       layer_norm=True, layer_windows=every_layer_window(full, fields["max_position"]))


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``starcoder2`` file's config, read as its loader reads it: the LayerNorms' epsilon
    (``attention.layer_norm_epsilon``), the biases those the file holds, nothing permuted (NEOX's rope, on halves), no
    window (llama.cpp's graph slides on none: every layer attends over everything)."""
    f = GGUFFields(fields, GGUF_ARCHITECTURE)
    return ModelConfig(**{**gguf_layer_norm_fields(fields, GGUF_ARCHITECTURE), "architecture": ARCHITECTURE},
                       qkv_bias=f.has_tensor(".attn_q.bias"), o_bias=f.has_tensor(".attn_output.bias"),
                       mlp_bias=f.has_tensor(".ffn_up.bias"), mlp_activation="gelu_tanh", layer_norm=True)


def starcoder2_tensor_name(name: str) -> str:
    """A StarCoder2 checkpoint tensor's name in the shared decoder (its MLP's as Llama's)."""
    return renamed(name, _MLP)

"""Arcee's AFM (AFM-4.5B; ``ArceeForCausalLM``, ``arcee``): Llama's layer with an ungated MLP
``down(relu(up(x))²)`` (``hidden_act`` ``relu2``; ``ModelConfig.mlp_activation``). ``config.json`` is completed with
transformers' ``ArceeConfig``; another ``hidden_act`` or MLP biases are refused by name. llama.cpp's ``arcee`` GGUF
files too (:func:`config_from_gguf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.gguf_config import gguf_base_fields, gguf_turn_end_ids
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = GGUF_ARCHITECTURE = "arcee"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import ArceeConfig

    return ungated_mlp_config(with_defaults(ARCHITECTURE, ArceeConfig, cfg), ARCHITECTURE, "relu2")


def ungated_mlp_config(full: Mapping[str, Any], architecture: str, activation: str, qk_norm: bool = False
                       ) -> ModelConfig:
    """The config of a Llama-shaped ``full`` config (its class's defaults filled in) whose MLP is ungated with
    ``activation`` (its ``hidden_act``; another, or MLP biases, refused by name): Arcee's, Apertus's."""
    if full.get("hidden_act") != activation or full.get("mlp_bias"):
        raise ModelLoadError(f"{architecture}: hidden_act {full.get('hidden_act')!r} (mlp_bias "
                             f"{bool(full.get('mlp_bias'))}) is not supported (only {activation}, no MLP biases)")
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**base_fields(full, architecture, check_mlp=False), qk_norm=qk_norm, qkv_bias=bias,
                       o_bias=bias, mlp_activation=activation)


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    """A llama.cpp ``arcee`` file's config: its llama converter's keys (q/k rows permuted, undone by the loader; yarn
    as ``rope.scaling.*``), the ungated squared-ReLU MLP its architecture implies; its end ids as every GGUF family's
    (the EOS, ``eot_token_id``)."""
    base = gguf_base_fields(fields, GGUF_ARCHITECTURE)
    return ModelConfig(**{**base, "architecture": ARCHITECTURE, "eos_token_ids": gguf_turn_end_ids(base, fields)},
                       mlp_activation="relu2")

"""Swiss AI's Apertus (8B, 70B; ``ApertusForCausalLM``, ``apertus``): Llama's layer with per-head q/k RMSNorms before
rope and an ungated MLP ``down(xielu(up(x)))`` whose xIELU activation has each layer's learned parameters
(``mlp.act_fn.alpha_p``/``alpha_n``/``beta``/``eps``; ``ModelConfig.mlp_activation``); its norms are named
``attention_layernorm`` and ``feedforward_layernorm``. ``config.json`` is completed with transformers'
``ApertusConfig``; another ``hidden_act`` is refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.arcee import ungated_mlp_config
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import with_defaults

ARCHITECTURE = "apertus"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import ApertusConfig

    return ungated_mlp_config(with_defaults(ARCHITECTURE, ApertusConfig, cfg), ARCHITECTURE, "xielu", qk_norm=True)


def apertus_tensor_name(name: str) -> str:
    """An Apertus checkpoint tensor's name in the shared decoder (its norms under Llama's names)."""
    return name.replace(".attention_layernorm.", ".input_layernorm.").replace(
        ".feedforward_layernorm.", ".post_attention_layernorm.")

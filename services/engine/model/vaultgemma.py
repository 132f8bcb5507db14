"""Google's VaultGemma (1B, trained with differential privacy; ``VaultGemmaForCausalLM``, ``vaultgemma``): Gemma 2's
model (:mod:`services.engine.model.gemma2`: sliding and full layers, softcaps) without the norms after attention and
the MLP (``GemmaConfig.post_norms`` off); its norm before the MLP, ``pre_feedforward_layernorm``, is read where
Gemma 1's is (:func:`vaultgemma_tensor_name`). ``config.json`` is completed with ``VaultGemmaConfig``'s defaults."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.gemma2 import gemma2_config
from services.engine.model.hf_config import with_defaults

ARCHITECTURE = "vaultgemma"

_PRE_MLP_NORM = re.compile(r"\.pre_feedforward_layernorm\.")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import VaultGemmaConfig

    return gemma2_config(with_defaults(ARCHITECTURE, VaultGemmaConfig, cfg), ARCHITECTURE, post_norms=False)


def vaultgemma_tensor_name(name: str) -> str:
    """A VaultGemma checkpoint tensor's name in Gemma's decoder (its norm before the MLP as Gemma 1 names it)."""
    return _PRE_MLP_NORM.sub(".post_attention_layernorm.", name)

"""Karpathy's nanochat (``NanoChatForCausalLM``, ``nanochat``: nanochat-d20, d32 and the community's): Llama's
layer with every norm an RMSNorm without a weight (the embeddings normed too, before the first layer), q and k normed
head by head *after* rope, whose rotation turns the other way (:mod:`services.engine.model.nanochat_decoder`), an
ungated squared-ReLU MLP (``fc1``/``fc2``), and the logits softcapped (``final_logit_softcapping``, 15 by default).
``config.json`` is completed with ``NanoChatConfig``'s defaults; another ``hidden_act`` is refused by name."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "nanochat"
_MLP = re.compile(r"^(model\.layers\.\d+\.mlp\.)fc([12])\.")


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import NanoChatConfig

    full = with_defaults(ARCHITECTURE, NanoChatConfig, cfg)
    if full.get("hidden_act") != "relu2":
        raise ModelLoadError(f"{ARCHITECTURE}: hidden_act {full.get('hidden_act')!r} is not supported (only 'relu2')")
    cap = full.get("final_logit_softcapping")
    bias = bool(full.get("attention_bias"))
    return ModelConfig(**base_fields(full, ARCHITECTURE, check_mlp=False), qkv_bias=bias, o_bias=bias, qk_norm=True,
                       qk_norm_after_rope=True, mlp_activation="relu2",
                       final_logit_softcap=float(cap) if cap else None)


def nanochat_tensor_name(name: str) -> str:
    """The MLP's ``fc1``/``fc2`` as the shared decoder's ungated ``up_proj``/``down_proj``."""
    return _MLP.sub(lambda m: f"{m[1]}{'up' if m[2] == '1' else 'down'}_proj.", name)

"""OpenBMB's MiniCPM3 (MiniCPM3-4B; ``MiniCPM3ForCausalLM``, ``minicpm3``): DeepSeek-V2's multi-head latent
attention (:func:`~services.engine.model.deepseek.latent_config`; rope on the rotated half's two halves, not on
adjacent pairs) over a dense SwiGLU MLP on every layer, with muP's three scalars
(:class:`~services.engine.model.config.Multipliers`): embeddings times ``scale_emb``, each block's output times
``scale_depth / √num_hidden_layers``, the final hidden state divided by ``hidden_size / dim_model_base`` before
the head. Read as ``MiniCPM3Config`` completes it (the release's longrope included). MiniCPM 1/2/4 (remote code,
``minicpm``) are not this family."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.deepseek import latent_config
from services.engine.model.hf_config import with_defaults

ARCHITECTURE = "minicpm3"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import MiniCPM3Config

    full = with_defaults(ARCHITECTURE, MiniCPM3Config, cfg)
    config = latent_config(full, ARCHITECTURE, None, interleaved=False)
    layers = int(full["num_hidden_layers"])
    scalars = dataclasses.replace(
        config.multipliers, embedding=float(full["scale_emb"]),
        residual=float(full["scale_depth"]) / math.sqrt(layers),
        head_input_divisor=int(full["hidden_size"]) / int(full["dim_model_base"]))
    return dataclasses.replace(config, multipliers=scalars)

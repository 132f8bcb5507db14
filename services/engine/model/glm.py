"""GLM-4 (GLM-4-9B-Chat, GLM-4-9B and GLM-4-9B-Chat-1M as converted to transformers' ``glm``: the ``-hf``
repositories; ``GlmForCausalLM``): GLM-4-0414's layer (:mod:`services.engine.model.glm4`) without the norms on the
blocks' outputs: rope on pairs of adjacent dims over the first ``partial_rotary_factor`` of each head, q/k/v biases
where ``attention_bias`` says, gate/up stored as one ``gate_up_proj``. ``config.json`` is completed with
transformers' own defaults (``GlmConfig``: a half-head rope, biases on). The 2024 repositories' own remote code
(``chatglm``) is not this family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.config import ModelConfig
from services.engine.model.hf_config import base_fields, with_defaults

ARCHITECTURE = "glm"


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    from transformers import GlmConfig

    full = with_defaults(ARCHITECTURE, GlmConfig, cfg)
    fields = base_fields(full, ARCHITECTURE, partial_rotary=True)
    return ModelConfig(**fields, qkv_bias=bool(full["attention_bias"]), rope_interleaved=True)

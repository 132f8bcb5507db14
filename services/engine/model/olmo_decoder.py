"""OLMo's decoder (:mod:`services.engine.model.olmo`): the LayerNorm decoder over norms without a weight or a bias,
each taken as a LayerNorm of weight 1 and bias 0 (exactly the unscaled norm)."""

from __future__ import annotations

import torch

from services.engine.model.config import ModelConfig
from services.engine.model.layernorm_decoder import LayerNormDecoderModel

_NORMS = ("input_layernorm", "post_attention_layernorm")


class OlmoDecoderModel(LayerNormDecoderModel):
    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], *args, **kwargs):
        hidden = config.hidden_size
        unit = {f"{prefix}.{part}": torch.ones(hidden) if part == "weight" else torch.zeros(hidden)
                for prefix in ["model.norm", *(f"model.layers.{i}.{norm}" for i in range(config.num_layers)
                                                for norm in _NORMS)]
                for part in ("weight", "bias")}
        super().__init__(config, {**tensors, **unit}, *args, **kwargs)

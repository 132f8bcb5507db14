"""The decoder of GPT-NeoX (:mod:`services.engine.model.gpt_neox`): the LayerNorm decoder
(:mod:`services.engine.model.layernorm_decoder`) over q, k and v regrouped from the checkpoint's fused projection,
which interleaves them head by head (``query_key_value``: each head's q, k, then v rows) into the shared decoder's
``qkv_proj`` (all q rows, then k, then v)."""

from __future__ import annotations

from typing import Any

import torch

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.layernorm_decoder import LayerNormDecoderModel


class GPTNeoXDecoderModel(LayerNormDecoderModel):
    """A :class:`LayerNormDecoderModel` over a GPT-NeoX checkpoint; same constructor."""

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        super().__init__(config, regrouped_qkv(config, tensors), dtype, *args, **kwargs)


def regrouped_qkv(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with each layer's ``self_attn.query_key_value`` (weight and bias, ``[heads, 3, head_dim]`` rows)
    as ``self_attn.qkv_proj`` (``[3, heads, head_dim]`` rows); a file that holds ``qkv_proj`` already (a GGUF file,
    regrouped by its converter) is left as it is."""
    out = dict(tensors)
    heads, dim = config.num_heads, config.head_dim
    for name in [n for n in tensors if ".self_attn.query_key_value." in n]:
        rows = out.pop(name)
        if rows.shape[0] != 3 * heads * dim:
            raise ModelLoadError(f"{name} has {rows.shape[0]} rows, the config needs {3 * heads * dim} (q, k and v "
                                 f"of {heads} heads of {dim})")
        grouped = rows.reshape(heads, 3, dim, *rows.shape[1:]).transpose(0, 1)
        out[name.replace(".query_key_value.", ".qkv_proj.")] = grouped.reshape(rows.shape).contiguous()
    return out

"""nanochat's decoder (:mod:`services.engine.model.nanochat`): the shared decoder over weights laid out as its
layer reads them.

- Its norms have no weight: each is taken as a weight of ones (an RMSNorm times 1 is the norm, exactly), the
  embeddings normed by the final norm before the first layer as transformers' ``NanoChatModel`` does.
- Its rope rotates each head's halves ``(x1, x2)`` into ``(x1·cos + x2·sin, x2·cos - x1·sin)``: the usual rotation of
  the halves swapped, with its output swapped. So the halves of each head's q and k rows are swapped at load and the
  usual rope runs: q·k, and the weightless per-head norms after rope, do not see the order of a head's dims (the
  values are not rotated and keep theirs).
"""

from __future__ import annotations

import torch

from kernels.norm import rms_norm
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel


class NanoChatDecoderModel(DecoderModel):
    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], *args, **kwargs):
        super().__init__(config, _as_shared_layout(config, tensors), *args, **kwargs)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return rms_norm(super()._embed(input_ids), self.final_norm, self.config.rms_norm_eps)


def _as_shared_layout(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with weights of ones for the weightless norms and each head's q and k rows (and biases) in
    swapped halves (see the module)."""
    out = dict(tensors)
    hidden, head = config.hidden_size, config.head_dim
    out["model.norm.weight"] = torch.ones(hidden)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = out[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
        out[p + "self_attn.q_norm.weight"] = out[p + "self_attn.k_norm.weight"] = torch.ones(head)
        for name in ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias"):
            stored = out.get(p + "self_attn." + name)
            if stored is not None and stored.shape[0] % head == 0:
                rows = stored.reshape(stored.shape[0] // head, 2, head // 2, *stored.shape[1:])
                out[p + "self_attn." + name] = rows.flip(1).reshape(stored.shape).contiguous()
    return out

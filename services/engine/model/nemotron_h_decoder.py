"""Nemotron-H's decoder: ``h += mixer(norm(h))`` per block, the mixer one of Mamba-2 (as Granite 4.0's,
:mod:`services.engine.model.mamba_decoder`), attention without rope, an MLP ``down(relu(up(x))²)``, or Nemotron 3's
experts of that MLP with a shared one (:func:`~services.engine.model.moe.moe_forward`, squared ReLU as their
activation). Norms compute in float32, the weight applied before the cast back. (The MLP block keeps its up
projection as the layer's ``gate_up``: it has no gate.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths, linear
from services.engine.model.config import ModelConfig
from services.engine.model.gemma_decoder import gemma_rms_norm
from services.engine.model.mamba_decoder import MambaDecoderModel, MambaLayerWeights
from services.engine.model.moe import moe_forward

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


class NemotronHDecoderModel(MambaDecoderModel):
    """A :class:`DecoderModel` over a Nemotron-H checkpoint; same constructor."""

    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, *args: Any,
                 **kwargs: Any):
        super().__init__(config, tensors, dtype, *args, **kwargs)
        self.final_norm = self.final_norm.float()

    def _layer(self, i: int) -> MambaLayerWeights:
        cfg, take, hidden, p = self.config, self._source.take, self.config.hidden_size, f"model.layers.{i}."
        m = p + "mixer."
        layer = MambaLayerWeights(input_norm=take(p + "input_layernorm.weight", (hidden,)).float(), qkv=None, o=None,  # type: ignore[arg-type]
                                  post_norm=None, gate_up=None, down=None)  # type: ignore[arg-type]
        if cfg.mamba is not None and i in cfg.mamba.layers:
            layer.mamba = self._mamba_weights(m)
        elif cfg.block_kinds[i] == "moe":
            layer.moe = self._experts(m)
        elif cfg.block_kinds[i] == "mlp":
            layer.gate_up = self._projection([(m + "up_proj.weight", (cfg.intermediate_size, hidden))])
            layer.down = self._projection([(m + "down_proj.weight", (hidden, cfg.intermediate_size))])
        else:
            layer.qkv = self._projection(self._qkv_parts(m))
            layer.o = self._projection([(m + "o_proj.weight", (hidden, cfg.q_size))])
        return layer

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches``: the attention blocks' only)."""
        eps = self.config.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed)
        rope = self.ops.rope.prepare(positions)
        for i, layer in enumerate(self.layers):
            x = gemma_rms_norm(hidden, layer.input_norm, eps)
            if layer.mamba is not None:
                hidden = hidden + self._mamba(i, layer.mamba, x, paths, states)
            elif layer.moe is not None:
                hidden = hidden + moe_forward(x, layer.moe, self.config.moe, relu_squared)  # type: ignore[arg-type]
            elif layer.down is not None:
                hidden = hidden + linear(relu_squared(linear(x, layer.gate_up, paths)), layer.down, paths)
            else:
                hidden = hidden + self._attention(i, layer, x, kv_caches[self._kv_index[i]], attention, rope, paths)
        return gemma_rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """Nemotron-H's MLP activation (``relu2``)."""
    return torch.relu(x).square()

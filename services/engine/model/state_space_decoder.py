"""The decoders of pure state-space models, with no attention and no MLP (:mod:`services.engine.model.mamba`,
:mod:`services.engine.model.mamba2`): per layer ``h = h + mixer(norm(h))``, the mixer Mamba-1's selective scan (Jamba's,
:mod:`services.engine.model.jamba_decoder`) or Mamba-2's (Granite 4.0's, :mod:`services.engine.model.mamba_decoder`),
then a final norm. The residual stream stays in float32 where the checkpoint says so
(``ModelConfig.residual_in_float32``, as transformers keeps it: each layer's norm reads the stream rounded to the
model dtype, the final norm the float32 stream, its output rounded once before the head).

Such a model keeps no KV (``ModelConfig.attention_free``): per sequence it has only its layers' states, which the
model runner passes to ``final_hidden``; the KV cache it is given is empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.norm import rms_norm
from services.engine.model.jamba_decoder import JambaDecoderModel, JambaLayerWeights
from services.engine.model.mamba_decoder import MambaDecoderModel, MambaLayerWeights

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from kernels.linear import RowPaths
    from services.engine.recurrent_states import RecurrentStates


class StateSpaceStack:
    """What both decoders share (mixed into a :class:`DecoderModel` with a ``_mamba(i, net, x, paths, states)``): the
    layer loop."""

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract (``kv_caches`` empty): ``h = h + mixer(norm(h))`` per layer,
        the final norm of the rows ``logits_indices``."""
        model: Any = self
        cfg, eps = model.config, model.config.rms_norm_eps
        hidden = F.embedding(input_ids, model.embed)
        if cfg.residual_in_float32:
            hidden = hidden.float()
        for i, layer in enumerate(model.layers):
            hidden = hidden + model._mamba(i, layer.mamba, rms_norm(hidden.to(model.dtype), layer.input_norm, eps),
                                           paths, states)
        last = hidden.index_select(0, logits_indices)
        return rms_norm(last, model.final_norm.to(last.dtype), eps).to(model.dtype)


class Mamba1DecoderModel(StateSpaceStack, JambaDecoderModel):
    """Mamba (Mamba-1) and Falcon-Mamba: a :class:`DecoderModel` over their checkpoints; same constructor."""

    def _layer(self, i: int) -> JambaLayerWeights:
        net = self._mamba1_weights(f"model.layers.{i}.mamba.")
        norm = self._source.take(f"model.layers.{i}.input_layernorm.weight", (self.config.hidden_size,))
        return JambaLayerWeights(input_norm=norm, qkv=net.in_proj, o=net.out_proj, post_norm=None,  # type: ignore[arg-type]
                                 gate_up=None, down=None, mamba=net)  # type: ignore[arg-type]


class Mamba2DecoderModel(StateSpaceStack, MambaDecoderModel):
    """Mamba-2 (Mamba-Codestral): a :class:`DecoderModel` over its checkpoints; same constructor."""

    def _layer(self, i: int) -> MambaLayerWeights:
        net = self._mamba_weights(f"model.layers.{i}.mamba.")
        norm = self._source.take(f"model.layers.{i}.input_layernorm.weight", (self.config.hidden_size,))
        return MambaLayerWeights(input_norm=norm, qkv=net.in_proj, o=net.out_proj, post_norm=None,  # type: ignore[arg-type]
                                 gate_up=None, down=None, mamba=net)  # type: ignore[arg-type]

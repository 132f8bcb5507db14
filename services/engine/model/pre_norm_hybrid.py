"""The layer loop of the hybrids whose every layer is ``h += mix(norm(h))`` then ``h += mlp(norm(h))`` with plain
RMSNorms, the mixer a recurrent layer's or the decoder's own attention (Jamba's, Kimi Linear's and Ling 3's): a mixin
of :class:`~services.engine.model.decoder.DecoderModel` (its subclass's ``_attention`` attends)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths
from kernels.norm import rms_norm

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend

# (layer index, its weights, its normed input) -> the recurrent mixer's output, None where the layer attends
Mixer = Callable[[int, Any, torch.Tensor], torch.Tensor | None]


class PreNormHybrid:
    """:meth:`_pre_norm_hidden`, for a :class:`~services.engine.model.decoder.DecoderModel` subclass."""

    config: Any
    embed: torch.Tensor
    final_norm: torch.Tensor
    layers: list[Any]
    ops: Any
    _kv_index: dict[int, int]
    _attention: Callable[..., torch.Tensor]
    _mlp: Callable[..., torch.Tensor]

    def _pre_norm_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                         attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None,
                         mix: Mixer) -> torch.Tensor:
        """``final_hidden``'s contract (``kv_caches``: the attention layers' only) through every layer, the recurrent
        ones mixing by ``mix``."""
        eps = self.config.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed)
        rope = self.ops.rope.prepare(positions)
        for i, layer in enumerate(self.layers):
            x = rms_norm(hidden, layer.input_norm, eps)
            mixed = mix(i, layer, x)
            if mixed is None:
                mixed = self._attention(i, layer, x, kv_caches[self._kv_index[i]], attention, rope, paths)
            hidden = hidden + mixed
            hidden = hidden + self._mlp(rms_norm(hidden, layer.post_norm, eps), layer, paths)
        return rms_norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

"""The shared decoder's layer with LayerNorms (a weight and a bias each) where it has RMSNorms
(``ModelConfig.layer_norm``): StarCoder2's, Jais 2's, Phi-3.5-MoE's, and Nemotron's, whose LayerNorms scale by
``1 + weight`` (``layer_norm_plus_one``); Phi-1's, Phi-2's and parallel StableLM's, whose attention and MLP share
one norm (``parallel_blocks``: ``h += attention(x) + mlp(x)``); GPT-NeoX's, whose MLP has a norm of its own in that
parallel layer (``parallel_mlp_norm``: ``h += attention(ln_1(h)) + mlp(ln_2(h))``).

Per layer: ``h += attention(ln_1(h))`` then ``h += mlp(ln_2(h))``, the final norm a LayerNorm too, each computed as
torch's ``layer_norm`` in the model dtype (as transformers' ``nn.LayerNorm``). Attention (its biases, windows, rope)
and the MLP (its activation and biases, ``ModelConfig.mlp_activation`` and ``mlp_bias``, or a sparse layer's experts)
are the shared decoder's (:meth:`DecoderModel._attention`, :meth:`DecoderModel._mlp`). Elementwise steps run torch's
ops."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths
from services.engine.model.decoder import DecoderModel, LayerWeights

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


@dataclass
class LayerNormLayerWeights(LayerWeights):
    input_norm_bias: torch.Tensor | None = None
    post_norm_bias: torch.Tensor | None = None


class LayerNormDecoderModel(DecoderModel):
    """A :class:`DecoderModel` whose norms are LayerNorms (see the module); same constructor."""

    FUSED_OPS = False
    SHARED_MLP = True
    LAYER_NORM = True

    def _model_weights(self) -> None:
        self.final_norm_bias = self._source.take("model.norm.bias", (self.config.hidden_size,))
        self.final_norm = self._scale(self.final_norm)

    def _layer(self, i: int) -> LayerNormLayerWeights:
        base = super()._layer(i)
        hidden, p = self.config.hidden_size, f"model.layers.{i}."
        layer = LayerNormLayerWeights(**{f.name: getattr(base, f.name) for f in fields(base)})
        layer.input_norm = self._scale(layer.input_norm)
        layer.input_norm_bias = self._source.take(p + "input_layernorm.bias", (hidden,))
        if layer.post_norm is not None:  # the shared decoder took it: a norm before the MLP of its own
            layer.post_norm = self._scale(layer.post_norm)
            layer.post_norm_bias = self._source.take(p + "post_attention_layernorm.bias", (hidden,))
        return layer

    def _scale(self, weight: torch.Tensor) -> torch.Tensor:
        """A LayerNorm's scale: its weight, or ``1 + weight`` in the weight's dtype (``layer_norm_plus_one``, as
        Nemotron's ``LayerNorm1P`` adds it)."""
        return weight + 1.0 if self.config.layer_norm_plus_one else weight

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract, with LayerNorms (see the module)."""
        cfg, eps = self.config, self.config.rms_norm_eps
        width = (cfg.hidden_size,)
        hidden = F.embedding(input_ids, self.embed)
        rope = self.ops.rope.prepare(positions)
        query_scale = self._query_scale(positions, hidden.dtype)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            assert isinstance(layer, LayerNormLayerWeights)
            x = F.layer_norm(hidden, width, layer.input_norm, layer.input_norm_bias, eps)
            attended = self._attention(i, layer, x, kv_cache, attention, rope, paths, query_scale)
            if cfg.parallel_blocks:  # Phi-2's: both blocks on the one norm (GPT-NeoX's: each its own), summed first
                if cfg.parallel_mlp_norm:
                    x = F.layer_norm(hidden, width, layer.post_norm, layer.post_norm_bias, eps)
                hidden = self._mlp(x, layer, paths) + attended + hidden
                continue
            hidden = hidden + attended
            x = F.layer_norm(hidden, width, layer.post_norm, layer.post_norm_bias, eps)
            hidden = hidden + self._mlp(x, layer, paths)
        return F.layer_norm(hidden.index_select(0, logits_indices), width, self.final_norm, self.final_norm_bias, eps)

"""Cohere's layer over the shared decoder's weights and projections (see :mod:`services.engine.model.cohere`):
``x = norm(h)``, then ``h = h + attention(x) + mlp(x)``; every norm a LayerNorm with a weight and no bias, computed
in float32 as transformers computes ``CohereLayerNorm`` (Command R+'s q and k normed so head by head, each head with
weights of its own, before rope); Cohere 2 MoE's RMSNorms where its config says so
(``ModelConfig.cohere_rms_norms``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kernels.linear import RowPaths
from kernels.norm import rms_norm
from services.engine.model.decoder import DecoderModel, LayerWeights

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend
    from services.engine.recurrent_states import RecurrentStates


def cohere_layer_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight · (x - mean) / sqrt(var + eps)`` over the last dim, in float32, cast back to ``x``'s dtype."""
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    return (weight.float() * ((h - mean) * torch.rsqrt(variance + eps))).to(x.dtype)


class CohereDecoderModel(DecoderModel):
    """A :class:`DecoderModel` over a Cohere checkpoint; same constructor. Its layers hold one norm (``input_norm``;
    ``post_norm`` unused: None). Served with torch's ops (FlashInfer's fused norm is an RMSNorm)."""

    FUSED_OPS = False

    def _layer(self, i: int) -> LayerWeights:
        cfg, p = self.config, f"model.layers.{i}."
        hidden, a = cfg.hidden_size, p + "self_attn."
        layer = LayerWeights(
            input_norm=self._source.take(p + "input_layernorm.weight", (hidden,)),
            qkv=self._projection(self._qkv_parts(a), bias=cfg.qkv_bias),
            o=self._projection([(a + "o_proj.weight", (hidden, cfg.q_size))], bias=cfg.o_bias),
            post_norm=None, gate_up=None, down=None,  # type: ignore[arg-type]  (one norm a layer)
        )
        if cfg.qk_norm:  # Command R+'s: [heads, head_dim]
            layer.q_norm = self._source.take(a + "q_norm.weight", (cfg.num_heads, cfg.head_dim))
            layer.k_norm = self._source.take(a + "k_norm.weight", (cfg.num_kv_heads, cfg.head_dim))
        return self._with_mlp(layer, i)

    def _head_norms(self, q: torch.Tensor, k: torch.Tensor, layer: LayerWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """Command R+'s: a LayerNorm over each head's dims, each head's own weights."""
        eps = self.config.rms_norm_eps
        return cohere_layer_norm(q, layer.q_norm, eps), cohere_layer_norm(k, layer.k_norm, eps)

    def final_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                     attention: AttentionBackend, logits_indices: torch.Tensor, paths: RowPaths | None = None,
                     states: RecurrentStates | None = None) -> torch.Tensor:
        """:meth:`DecoderModel.final_hidden`'s contract, in Cohere's layer."""
        eps = self.config.rms_norm_eps
        norm = rms_norm if self.config.cohere_rms_norms else cohere_layer_norm
        hidden = F.embedding(input_ids, self.embed)
        rope = self.ops.rope.prepare(positions)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x = norm(hidden, layer.input_norm, eps)
            attended = self._attention(i, layer, x, kv_cache, attention, rope, paths)
            hidden = hidden + attended + self._mlp(x, layer, paths)
        return norm(hidden.index_select(0, logits_indices), self.final_norm, eps)

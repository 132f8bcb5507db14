"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): latent attention (:mod:`services.engine.model.mla_decoder`) whose
queries attend only the ``topk`` earlier tokens a lightning indexer picks (:mod:`kernels.attention.sparse_index`).

Each layer's indexer (``self_attn.indexer``) projects, per token, an index query of ``heads`` heads from the q
bottleneck (``wq_b``), one index key from the layer's input (``wk``, then a LayerNorm with bias, ``k_norm``) and a
weight per head (``weights_proj``, float32, times ``heads ** -0.5``); the leading ``qk_rope_head_dim`` dims of the
query and the key rotate with the latent rope's angles in the rotate-half layout (transformers'
``apply_rotary_pos_emb``; the latent's own rope is interleaved; GLM-5's in the latent's interleaved pairs). GLM-5's
shared layers (``SparseIndex.shared_layers``) run no indexer: they attend what the step's previous indexed layer
picked, and their rows' index dims stay 0. The index key is cached after the latent in the token's row (``[k_rope |
latent | index key]``, :attr:`~services.engine.model.config.LatentAttention.cache_dim`), so that the prefill node's
rows carry it to the decode node, the prefix cache keeps it and preemption saves it as any KV; the attention's query
is zero over it, and its output there is dropped. Scores and picks are float32, as transformers computes them.

Not served by the fused ops or CUDA graphs (the indexed layers run the wrapper's torch path past ``topk`` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kernels.attention.sparse_index import IndexQuery, SparseIndexAttention
from kernels.linear import LinearWeight, RowPaths, linear
from kernels.rope import RotaryEmbedding
from services.engine.model.config import SparseIndex
from services.engine.model.decoder import LayerWeights
from services.engine.model.mla_decoder import LatentAttentionDecoderModel, LatentLayerWeights

if TYPE_CHECKING:
    from kernels.attention.base import AttentionBackend

INDEX_NORM_EPS = 1e-6  # the index key's LayerNorm (transformers' DeepseekV32Indexer builds it so)


@dataclass
class IndexerWeights:
    wq_b: LinearWeight  # [heads * head_dim, q_lora_rank]
    wk: LinearWeight  # [head_dim, hidden]
    k_norm_weight: torch.Tensor  # [head_dim]
    k_norm_bias: torch.Tensor
    weights_proj: torch.Tensor  # [heads, hidden] float32


@dataclass
class IndexedLayerWeights(LatentLayerWeights):
    indexer: IndexerWeights | None = None


class SparseLatentDecoderModel(LatentAttentionDecoderModel):
    """A :class:`LatentAttentionDecoderModel` whose layers attend through an indexer (see the module); the attention
    backend it runs with must be a :class:`SparseIndexAttention`."""

    FUSED_OPS = False  # the step's rope tables, in torch's layout, also rotate the indexer
    QUERY_TEMPERATURE = False  # (none of its checkpoints has one)

    @property
    def _index(self) -> SparseIndex:
        assert self._mla.index is not None
        return self._mla.index

    def _layer(self, i: int) -> LayerWeights:
        base = super()._layer(i)
        layer = IndexedLayerWeights(**{name: getattr(base, name) for name in base.__dataclass_fields__})
        index, mla, take = self._index, self._mla, self._source.take
        if i in index.shared_layers:  # GLM-5's: no indexer of its own
            return layer
        n, hidden = f"model.layers.{i}.self_attn.indexer.", self.config.hidden_size
        layer.indexer = IndexerWeights(
            wq_b=self._projection([(n + "wq_b.weight", (index.heads * index.head_dim, mla.q_lora_rank))]),
            wk=self._projection([(n + "wk.weight", (index.head_dim, hidden))]),
            k_norm_weight=take(n + "k_norm.weight", (index.head_dim,)),
            k_norm_bias=take(n + "k_norm.bias", (index.head_dim,)),
            weights_proj=take(n + "weights_proj.weight", (index.heads, hidden)).float())
        return layer

    def _attention(self, i: int, layer: LayerWeights, x: torch.Tensor, kv_cache: torch.Tensor,
                   attention: AttentionBackend, rope: object, paths: RowPaths | None,
                   query_scale: torch.Tensor | None = None) -> torch.Tensor:
        assert isinstance(layer, IndexedLayerWeights) and layer.latent is not None
        assert isinstance(attention, SparseIndexAttention), "DeepSeek Sparse Attention runs on SparseIndexAttention"
        index, tokens = self._index, x.shape[0]
        q, k, q_resid = self._latent_qk(layer.latent, x, paths)
        q, k = self.ops.rope(q, k, rope)
        query, index_k = None, k.new_zeros(tokens, 1, index.head_dim)  # a shared layer's: its picks are another's
        if layer.indexer is not None:
            assert q_resid is not None and isinstance(rope, tuple)
            query, index_k = self._index_query(layer.indexer, x, q_resid, rope, paths)
        q = torch.cat((q, q.new_zeros(tokens, q.shape[1], index.head_dim)), dim=-1)
        k = torch.cat((k, index_k), dim=-1)
        out = attention.forward_indexed(q, k, k, kv_cache, self.scale, query, index.topk)
        return self._latent_out(layer, out, paths)

    def _index_query(self, w: IndexerWeights, x: torch.Tensor, q_resid: torch.Tensor, rope: tuple,
                     paths: RowPaths | None) -> tuple[IndexQuery, torch.Tensor]:
        """The indexer's query side of ``x`` and its index keys ``[T, 1, head_dim]``, both rotated."""
        index, tokens = self._index, x.shape[0]
        index_q = linear(q_resid, w.wq_b, paths).view(tokens, index.heads, index.head_dim)
        index_k = F.layer_norm(linear(x, w.wk, paths), (index.head_dim,), w.k_norm_weight, w.k_norm_bias,
                               INDEX_NORM_EPS).view(tokens, 1, index.head_dim)
        if index.interleaved_rope:  # GLM-5's: the latent's own pairs
            index_q, index_k = self.rope.rotate(index_q, *rope), self.rope.rotate(index_k, *rope)
        else:
            cos, sin = RotaryEmbedding.rotate_half_tables(*rope)
            index_q, index_k = RotaryEmbedding.apply(index_q, cos, sin), RotaryEmbedding.apply(index_k, cos, sin)
        weights = F.linear(x.float(), w.weights_proj) * index.heads**-0.5
        offset = self._mla.cache_dim - index.head_dim
        return IndexQuery(index_q, weights, offset, index.head_dim**-0.5), index_k

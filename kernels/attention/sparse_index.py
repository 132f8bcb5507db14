"""Attention over the keys a learned index picks (DeepSeek Sparse Attention, DeepSeek-V3.2's lightning indexer): each
query at position ``p`` attends only the ``topk`` positions ``t <= p`` of highest index score

    score(p, t) = Σ_h w_h(p) · relu(q_h(p) · k(t) · scale)

over the indexer's heads ``h`` (its query ``q_h`` and weight ``w_h`` per token, one index key ``k`` per token, cached
in each token's KV row from ``key_offset`` on); a query with ``topk`` or fewer earlier positions attends all of them,
as transformers' top-k of ``min(topk, length)`` gives. Among equal scores (``relu`` makes exact zeros common with
few index heads) the earlier position is picked: transformers' ``torch.topk`` breaks such ties by the shape of its
scores (its cached and uncached forwards can pick differently), DeepSeek's kernels by theirs; a rule of position
keeps a step's pick the same however the tokens were batched or chunked.

:class:`SparseIndexAttention` wraps any backend: a step whose sequences all fit in ``topk`` is plain causal attention
(the wrapped backend's); a longer one writes the step's KV, then, sequence by sequence, gathers its rows, scores and
picks them in float32 (transformers' precision) and attends the picked ones (float32 scores and softmax). That path is
torch on the host's or the device's tensors, one sequence and a block of its queries at a time
(:data:`SCORES_PER_BLOCK`): exact, not fast. A step with any sequence past ``topk`` sends all its sequences that way,
the short ones too: the same math as the backend's, rounded alike in float32 (in bf16 the two round differently, so a
short sequence's numbers there can depend on what it shares a step with).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention.base import AttentionBackend, write_kv
from kernels.attention.metadata import AttentionMetadata

SCORES_PER_BLOCK = 1 << 25
"""Float32 scores held at once on the sparse path (``queries × heads × length``, 128 MiB): a sequence's queries are
scored and attended this many at a time (DeepSeek-V3.2's 128 heads over 32K tokens: 8 queries a block)."""


@dataclass(frozen=True)
class IndexQuery:
    """The indexer's side of a step: ``q`` ``[T, heads, head_dim]`` (rotated), ``weights`` ``[T, heads]`` float32
    (its head weights, already scaled), the index key's first dim in a cached row, and ``scale``."""

    q: torch.Tensor
    weights: torch.Tensor
    key_offset: int
    scale: float


class SparseIndexAttention(AttentionBackend):
    """``inner`` for plain layers and short steps; :meth:`forward_indexed` for the indexed layers (see the module)."""

    def __init__(self, inner: AttentionBackend):
        self.inner = inner
        self.name = inner.name  # reports as the backend it wraps
        self.supports_window = inner.supports_window
        self.supports_sinks = inner.supports_sinks
        self.supports_softcap = inner.supports_softcap
        self._meta: AttentionMetadata | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        self.inner.plan(meta)
        self._meta = meta
        self._picked: list[torch.Tensor] | None = None  # the step's last indexed layer's, per sequence

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float,
                **options: object) -> torch.Tensor:
        return self.inner.forward(q, k, v, kv_cache, scale, **options)  # type: ignore[call-arg]

    def forward_indexed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                        scale: float, index: IndexQuery | None, topk: int) -> torch.Tensor:
        """Causal attention (``q`` ``[T, H, D]``, ``k``/``v`` ``[T, Hkv, D]`` written to ``kv_cache``) restricted to
        the ``topk`` positions ``index`` picks (None: those the step's previous indexed layer picked, GLM-5's shared
        layers); ``[T, H, D]`` in ``q``'s dtype."""
        meta = self._meta
        if meta is None:
            raise RuntimeError("SparseIndexAttention.forward_indexed called before plan()")
        if meta.max_seq_len <= topk:  # every query's earlier positions all picked: plain causal attention
            return self.inner.forward(q, k, v, kv_cache, scale)
        if index is None and self._picked is None:
            raise RuntimeError("a layer that shares its picks ran before any indexed layer of the step")
        write_kv(kv_cache, k, v, meta.slot_mapping)
        tables = meta.block_tables
        out = torch.empty_like(q)
        picked = []
        heads = max(q.shape[1], 0 if index is None else index.q.shape[1])
        for i in range(meta.num_seqs):
            start, stop, length = meta.query_starts[i], meta.query_starts[i + 1], meta.seq_lens[i]
            keys, values = (_sequence_rows(kv_cache, which, tables[i], length) for which in (0, 1))
            block = max(1, SCORES_PER_BLOCK // (heads * length))  # queries at a time: bounds the [Q, H, L] scores
            allowed_rows = []
            for first in range(start, stop, block):
                last = min(stop, first + block)
                if index is None:  # a shared layer's: the previous indexed layer's picks
                    allowed = self._picked[i][first - start:last - start]  # type: ignore[index]
                else:
                    positions = torch.arange(length - (stop - first), length - (stop - last), device=q.device)
                    allowed = _picked(index, topk, first, last, keys, positions)
                out[first:last] = _attend(q[first:last], keys, values, allowed, scale).to(q.dtype)
                allowed_rows.append(allowed)
            picked.append(torch.cat(allowed_rows))
        self._picked = picked
        return out


def _sequence_rows(kv_cache: torch.Tensor, which: int, table: torch.Tensor, length: int) -> torch.Tensor:
    """``[length, Hkv, D]``: the K (``which`` 0) or V rows of a sequence's first ``length`` positions."""
    _, _, block_size, heads, dim = kv_cache.shape
    blocks = table[: -(-length // block_size)].to(torch.int64)
    return kv_cache[blocks, which].reshape(-1, heads, dim)[:length]


def _picked(index: IndexQuery, topk: int, start: int, stop: int, keys: torch.Tensor, positions: torch.Tensor
            ) -> torch.Tensor:
    """``[Q, L]`` bool: the positions each of the sequence's queries attends (causal, and the ``topk`` the index
    scores highest)."""
    dim = index.q.shape[-1]
    index_keys = keys[:, 0, index.key_offset:index.key_offset + dim].float()  # [L, dim]: one index key a token
    per_head = torch.relu(torch.einsum("qhd,ld->qhl", index.q[start:stop].float(), index_keys) * index.scale)
    scores = torch.einsum("qh,qhl->ql", index.weights[start:stop], per_head)
    causal = torch.arange(keys.shape[0], device=keys.device)[None, :] <= positions[:, None]
    scores = scores.masked_fill(~causal, float("-inf"))
    # a stable sort: among equal scores the earlier position first, whatever the step's shape (see the module)
    chosen = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :topk]
    return torch.zeros_like(causal).scatter(-1, chosen, True) & causal


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor,
            scale: float) -> torch.Tensor:
    """Attention of ``q`` ``[Q, H, D]`` over ``keys``/``values`` ``[L, Hkv, D]`` where ``allowed`` ``[Q, L]``, in
    float32; each KV head serves its group of query heads as it is (no copy per head)."""
    tokens, heads, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.float().view(tokens, kv_heads, heads // kv_heads, dim)
    scores = torch.einsum("qkgd,lkd->kgql", grouped, keys.float()) * scale
    scores = scores.masked_fill(~allowed[None, None], float("-inf"))
    out = torch.einsum("kgql,lkd->qkgd", torch.softmax(scores, dim=-1), values.float())
    return out.reshape(tokens, heads, dim)

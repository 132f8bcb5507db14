"""Attention computed from explicit float32 scores, for what torch's fused attention does not take:

- **sinks** (GPT-OSS): a learned logit per head joins every query's softmax with no value, so a query may give
  part of its weight to nothing (the sink appended to the scores, the softmax, the sink's column dropped);
- **logit softcapping** (Gemma 2): each score becomes ``cap * tanh(score / cap)`` before the mask and the
  softmax.

Computed as transformers' eager attention computes them (scores scaled, capped, masked, softmax in float32), in
pieces of at most :data:`SCORE_BUDGET` scores: whole, a long prompt's would not fit (one prefill chunk of 1024
queries over 131072 positions, 64 heads: 32 GiB of float32 scores)."""

from __future__ import annotations

import torch

SCORE_BUDGET = 1 << 24
"""The most float32 scores one piece holds (64 MiB; a few buffers of that size live at once)."""


def explicit_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, *,
                  sinks: torch.Tensor | None = None, softcap: float | None = None,
                  attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                  enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s contract for 4-D ``query [B, H, Lq, D]`` and ``key``/``value
    [B, Hk, Lk, D]`` (an additive ``attn_mask`` broadcastable to ``[B, H, Lq, Lk]``, or ``is_causal`` aligned
    top-left as torch's), plus ``sinks``: the sink logit of each query row, broadcastable to ``[B, H, Lq, 1]``
    (a head's logit where the heads are in dim 1; a caller folding query heads into the query length reshapes
    it to match), and ``softcap`` (> 0). Pieces: whole sequences while they fit the budget, else row ranges of
    one sequence."""
    if enable_gqa and key.shape[1] != query.shape[1]:
        repeat = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    batch, heads, query_len, _ = query.shape
    key_len = key.shape[2]
    per_row = heads * key_len
    seqs = max(1, SCORE_BUDGET // (per_row * query_len))
    rows = query_len if per_row * query_len <= SCORE_BUDGET else max(1, SCORE_BUDGET // per_row)
    if sinks is not None:
        sinks = sinks.to(device=query.device, dtype=torch.float32).expand(batch, heads, query_len, 1)
    mask = None if attn_mask is None else attn_mask.expand(batch, heads, query_len, key_len)
    out = torch.empty(batch, heads, query_len, value.shape[-1], dtype=value.dtype, device=value.device)
    for first in range(0, batch, seqs):
        last = min(first + seqs, batch)
        keys, values = key[first:last].float().transpose(-1, -2), value[first:last]
        for start in range(0, query_len, rows):
            end = min(start + rows, query_len)
            scores = torch.matmul(query[first:last, :, start:end].float(), keys) * scale
            if softcap is not None:
                scores = torch.tanh(scores.div_(softcap)).mul_(softcap)
            if is_causal:  # query i sees keys 0..i
                hidden = torch.ones(end - start, key_len, dtype=torch.bool, device=scores.device).triu(1 + start)
                scores.masked_fill_(hidden, float("-inf"))
            if mask is not None:
                scores += mask[first:last, :, start:end]
            if sinks is None:
                probs = torch.softmax(scores, dim=-1)
            else:
                probs = torch.softmax(torch.cat([scores, sinks[first:last, :, start:end]], dim=-1), dim=-1)[..., :-1]
            out[first:last, :, start:end] = torch.matmul(probs.to(values.dtype), values)
    return out

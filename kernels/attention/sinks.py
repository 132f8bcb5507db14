"""Attention with sinks (GPT-OSS): each head has a learned logit that joins every query's softmax with no value,
so a query may give part of its weight to nothing. Computed as transformers' eager attention computes it (the
sink appended to the scores, the softmax, the sink's column dropped), with the scores and the softmax in
float32."""

from __future__ import annotations

import torch


def sdpa_with_sinks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor,
                    scale: float, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                    enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s contract (``query [..., H, Lq, D]``, ``key``/``value [..., Hk, Lk, D]``,
    an additive ``attn_mask`` or ``is_causal`` aligned top-left as torch's), plus ``sinks``: the sink logit of
    each query row, broadcastable to ``[..., H, Lq, 1]`` (a head's logit where the heads are in dim -3; a model
    folding query heads into the query length reshapes it to match)."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if is_causal:
        query_len, key_len = scores.shape[-2:]
        hidden = torch.ones(query_len, key_len, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask
    sink = sinks.to(device=scores.device, dtype=torch.float32).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(value.dtype), value)

"""Test scaffolding for paged attention: random sequences scattered over a garbage-filled cache, and a
dense float64 oracle computed from each sequence's contiguous K/V."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from kernels.attention import AttentionBackend, AttentionMetadata


@dataclass
class Sequences:
    """Full K/V of every sequence (``[seq_len, Hkv, D]``), the block table that places it, and the
    cache dtype; ``cache`` holds each sequence's already-computed prefix, everything else is garbage."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    tables: list[list[int]]
    cache: torch.Tensor
    block_size: int

    def step(
        self, query_lens: list[int], seq_lens: list[int], num_heads: int, seed: int
    ) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Metadata and (q, k, v) for a step in which sequence i computes positions
        ``seq_lens[i] - query_lens[i] .. seq_lens[i] - 1``."""
        gen = torch.Generator().manual_seed(seed)
        meta = AttentionMetadata.build(query_lens, seq_lens, self.tables, self.block_size, self.cache.device)
        spans = [slice(s - q, s) for q, s in zip(query_lens, seq_lens, strict=True)]
        k = torch.cat([key[span] for key, span in zip(self.keys, spans, strict=True)])
        v = torch.cat([value[span] for value, span in zip(self.values, spans, strict=True)])
        head_dim = k.shape[-1]
        q = torch.randn(k.shape[0], num_heads, head_dim, generator=gen).to(self.cache.dtype)
        return meta, q, k.to(self.cache.device), v.to(self.cache.device)


def make_sequences(
    seq_lens: list[int],
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    spare_blocks: int = 3,
    device: str = "cpu",
    tables: list[list[int]] | None = None,
) -> Sequences:
    """Sequences of the given total lengths on randomly permuted physical blocks (block 0 never
    used, so zero-padded table entries point at garbage), with the first ``context_lens[i]`` positions
    of each already in the cache. Unused slots hold NaN or +-1e30. ``tables`` reuses a layout."""
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = 1 + sum(needed) + spare_blocks
    if tables is None:
        physical = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        tables, cursor = [], 0
        for n in needed:
            tables.append(physical[cursor : cursor + n])
            cursor += n
    num_blocks = max(num_blocks, 1 + max(b for t in tables for b in t))
    cache = torch.full((num_blocks, 2, block_size, num_kv_heads, head_dim), float("nan"))
    huge = torch.rand(cache.shape, generator=gen) < 0.5
    cache[huge] = 1e30 * torch.sign(torch.randn(int(huge.sum()), generator=gen))
    cache = cache.to(dtype)
    keys = [torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype) for s in seq_lens]
    values = [torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype) for s in seq_lens]
    for key, value, table, context in zip(keys, values, tables, context_lens, strict=True):
        for pos in range(context):
            block, offset = table[pos // block_size], pos % block_size
            cache[block, 0, offset] = key[pos]
            cache[block, 1, offset] = value[pos]
    return Sequences(keys, values, tables, cache.to(device), block_size)


def oracle(q: torch.Tensor, seqs: Sequences, query_lens: list[int], seq_lens: list[int], scale: float,
           window: int | None = None, sinks: torch.Tensor | None = None, softcap: float | None = None,
           chunk: int | None = None) -> torch.Tensor:
    """Dense float64 attention: query j of sequence i sees positions ``0..p`` where ``p = seq_len - query_len
    + j`` (with a sliding ``window``: ``p - window + 1..p``; with an attention ``chunk``: ``p - p % chunk..p``);
    ``sinks [Hq]``: each head's softmax also counts ``exp(sinks[h])``, with no value (transformers' GPT-OSS eager
    attention); ``softcap``: each scaled score ``s`` is ``softcap * tanh(s / softcap)`` (transformers' Gemma 2
    eager attention)."""
    outputs, start = [], 0
    num_heads = q.shape[1]
    for key, value, query_len, seq_len in zip(seqs.keys, seqs.values, query_lens, seq_lens, strict=True):
        group = num_heads // key.shape[1]
        k = key[:seq_len].double().repeat_interleave(group, dim=1)
        v = value[:seq_len].double().repeat_interleave(group, dim=1)
        query = q[start : start + query_len].double().cpu()
        scores = torch.einsum("thd,shd->hts", query, k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        query_pos = torch.arange(seq_len - query_len, seq_len).view(-1, 1)
        visible = torch.arange(seq_len).view(1, -1) <= query_pos
        if window is not None:
            visible &= torch.arange(seq_len).view(1, -1) > query_pos - window
        if chunk is not None:
            visible &= torch.arange(seq_len).view(1, -1) // chunk == query_pos // chunk
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.double().view(-1, 1, 1).expand(-1, query_len, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        outputs.append(torch.einsum("hts,shd->thd", probs, v))
        start += query_len
    return torch.cat(outputs)


TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
"""Absolute error allowed against the float64 oracle (outputs are O(1))."""


def check_forward_contract(backend: AttentionBackend, dtype: torch.dtype, head_dim: int, block_size: int):
    """What every backend's ``forward`` refuses: a call before ``plan`` (RuntimeError) and a q of another
    length than planned (ValueError). Returns the planned one-sequence decode step's ``(seqs, q, k, v)``
    for the backend's own checks."""
    seqs = make_sequences([5], [4], 3, head_dim, block_size, dtype, seed=0)
    meta, q, k, v = seqs.step([1], [5], 9, seed=0)
    with pytest.raises(RuntimeError, match="before plan"):
        backend.forward(q, k, v, seqs.cache, 1.0)
    backend.plan(meta)
    with pytest.raises(ValueError, match="planned 1 tokens"):
        backend.forward(torch.cat([q, q]), k, v, seqs.cache, 1.0)
    return seqs, q, k, v

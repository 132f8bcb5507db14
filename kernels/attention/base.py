"""The attention backend contract and the paged KV cache layout every backend shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from kernels.attention.metadata import AttentionMetadata

K_INDEX, V_INDEX = 0, 1
"""Index of K and V along dim 1 of a layer's KV cache."""


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    """Shape of one layer's paged KV cache: ``[num_blocks, 2, block_size, num_kv_heads, head_dim]``."""
    return (num_blocks, 2, block_size, num_kv_heads, head_dim)


class AttentionBackend(ABC):
    """Paged causal attention over a per-layer KV cache ``[num_blocks, 2, block_size, Hkv, D]``.

    Call ``plan`` once per scheduler step, then ``forward`` once per layer of that step.

    ``supports_window``: ``forward`` takes a ``window`` (sliding-window layers, Gemma 2 and 3); ``supports_sinks``:
    it takes ``sinks`` (GPT-OSS's attention sinks); ``supports_softcap``: it takes ``softcap`` (Gemma 2's
    attention logit softcapping). A backend without one is never handed it (the model runner picks one that
    has it, or refuses the model).
    """

    name: ClassVar[str]
    supports_window: ClassVar[bool] = False
    supports_sinks: ClassVar[bool] = False
    supports_softcap: ClassVar[bool] = False

    @abstractmethod
    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare everything reusable across the layers of one step (masks, gather indices, the
        split into decode and prefill sequences). Replaces any previous plan."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Attention for the T new tokens of the planned step.

        ``q`` is ``[T, Hq, D]``, ``k`` and ``v`` are ``[T, Hkv, D]`` with ``Hq % Hkv == 0`` (GQA: query
        head h reads KV head ``h // (Hq // Hkv)``). Writes k, v into ``kv_cache`` at the planned slots,
        then returns the attention output ``[T, Hq, D]`` (contiguous, dtype of q) where each query
        attends causally to its own sequence's KV: query j of sequence i (absolute position
        ``p = seq_lens[i] - query_lens[i] + j``) sees positions ``0..p`` (causal mask aligned
        bottom-right). Cache slots past a sequence's length are never read into the result.

        A backend with ``supports_window`` also takes ``window=W`` (an int >= 1; None: full attention): query
        position p then sees positions ``max(0, p - W + 1)..p`` only, as transformers' sliding-window mask.
        A backend with ``supports_sinks`` also takes ``sinks``, a float32 ``[Hq]`` tensor (None: no sinks): the
        softmax of each query of head h also counts ``exp(sinks[h])``, with no value (:mod:`.explicit`).
        A backend with ``supports_softcap`` also takes ``softcap``, a float > 0 (None: none): each scaled score
        ``s`` becomes ``softcap * tanh(s / softcap)`` before the mask and the softmax.
        """


def kv_rows(slot_mapping: torch.Tensor, block_size: int) -> torch.Tensor:
    """Row of each slot's K in a contiguous cache viewed as ``[num_blocks * 2 * block_size, Hkv, D]``;
    its V row is ``block_size`` further."""
    slots = slot_mapping.to(torch.int64)
    return slots // block_size * (2 * block_size) + slots % block_size


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the K and V of T tokens (``[T, Hkv, D]``): token t goes to slot ``slot_mapping[t]``, i.e.
    block ``slot // block_size`` at offset ``slot % block_size``."""
    write_kv_rows(kv_cache, k, v, kv_rows(slot_mapping, kv_cache.shape[2]))


def write_kv_rows(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
    """``write_kv`` with the K rows (see ``kv_rows``) already computed."""
    num_blocks, two, block_size, num_kv_heads, head_dim = kv_cache.shape
    assert two == 2, f"kv_cache must be [num_blocks, 2, block_size, Hkv, D], got {list(kv_cache.shape)}"
    if k.shape != v.shape or k.shape[1:] != (num_kv_heads, head_dim):
        raise ValueError(f"k, v must be [T, {num_kv_heads}, {head_dim}], got {list(k.shape)}, {list(v.shape)}")
    if k.dtype != kv_cache.dtype or v.dtype != kv_cache.dtype:
        raise TypeError(f"k/v dtype {k.dtype}/{v.dtype} differs from the cache's {kv_cache.dtype}")
    if kv_cache.is_contiguous():
        token_rows = kv_cache.view(num_blocks * 2 * block_size, num_kv_heads, head_dim)
        token_rows.index_copy_(0, rows, k)
        token_rows.index_copy_(0, rows + block_size, v)
    else:
        blocks, offsets = rows // (2 * block_size), rows % (2 * block_size)
        kv_cache[blocks, K_INDEX, offsets] = k
        kv_cache[blocks, V_INDEX, offsets] = v

"""Decode attention that a CUDA graph can hold: every array it reads on the device lives in a buffer
allocated once, so a step replayed from a graph reads the step it was planned for.

Contract (:class:`GraphDecodeAttention`): ``plan(meta)`` runs outside the graph, on a decode-only step
whose rows are already padded to one of the captured batch sizes (the caller points padding rows at a
block no request owns); it writes the step's page table into the fixed buffers. ``forward`` is what the
graph captures: it appends the step's K/V and attends, reading only those buffers and the shapes of its
arguments. Shapes never change between capture and replay: one graph per batch size.

:class:`TorchGraphDecode` is the pure-torch implementation (any dtype, any device; the float32 parity
mode's on a GPU, and the one CPU tests replay): each row gathers ``max_pages`` pages and masks what lies
past its length, so its memory grows with ``max_pages`` (:meth:`TorchGraphDecode.peak_bytes`).
FlashInfer's CUDA-graph decode is ``kernels.attention.flashinfer_graph``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from kernels.attention.base import write_kv
from kernels.attention.metadata import AttentionMetadata


class GraphDecodeAttention(ABC):
    """Decode attention over fixed buffers for at most ``max_batch`` rows of at most ``max_pages`` pages."""

    name: str
    max_batch: int
    max_pages: int

    def check_step(self, meta: AttentionMetadata) -> None:
        """``ValueError`` unless ``meta`` is a decode-only step these buffers hold."""
        if meta.prefill_seqs:
            raise ValueError(f"graph decode attention runs decode-only steps; sequences {meta.prefill_seqs} "
                             f"have more than one new token")
        if not 1 <= meta.num_seqs <= self.max_batch:
            raise ValueError(f"{meta.num_seqs} sequences; the buffers hold 1 to {self.max_batch}")
        pages = -(-max(meta.seq_lens) // meta.block_size)
        if pages > self.max_pages:
            raise ValueError(f"a sequence of {max(meta.seq_lens)} tokens needs {pages} pages; the buffers hold "
                             f"{self.max_pages} per sequence")

    @abstractmethod
    def plan(self, meta: AttentionMetadata) -> None:
        """Write a decode-only step of ``meta.num_seqs`` rows (padded to a captured size) into the buffers."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                scale: float) -> torch.Tensor:
        """As :meth:`AttentionBackend.forward` for the planned rows (``q.shape[0]`` of them)."""


class TorchGraphDecode(GraphDecodeAttention):
    """Pure-torch decode attention over fixed buffers (see the module)."""

    name = "torch"

    def __init__(self, device: torch.device | str, max_batch: int, max_pages: int, block_size: int):
        self.device = torch.device(device)
        self.max_batch, self.max_pages, self.block_size = max_batch, max_pages, block_size
        self.tables = torch.zeros(max_batch, max_pages, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int64, device=self.device)
        self.slots = torch.zeros(max_batch, dtype=torch.int64, device=self.device)
        self._key_positions = torch.arange(max_pages * block_size, device=self.device)

    def peak_bytes(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """The memory one layer's forward of ``batch`` rows holds at its peak: the gathered pages (K and V of
        ``max_pages`` pages a row), K and V each copied out of them, their float32 copies and the masked V."""
        elements = batch * self.max_pages * self.block_size * num_kv_heads * head_dim  # of K, or of V
        return elements * (4 * dtype.itemsize + 3 * 4)

    def plan(self, meta: AttentionMetadata) -> None:
        self.check_step(meta)
        n, width = meta.num_seqs, meta.block_tables.shape[1]
        width = min(width, self.max_pages)  # columns past a row's pages are padding (0)
        self.tables[:n].zero_()
        self.tables[:n, :width].copy_(meta.block_tables[:, :width])
        self.seq_lens[:n].copy_(torch.tensor(meta.seq_lens, dtype=torch.int64))
        self.slots[:n].copy_(meta.slot_mapping)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                scale: float) -> torch.Tensor:
        rows, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[3]
        write_kv(kv_cache, k, v, self.slots[:rows])
        pages = kv_cache[self.tables[:rows]]  # [rows, max_pages, 2, block_size, Hkv, D]
        keys = pages[:, :, 0].reshape(rows, -1, num_kv_heads, head_dim).float()
        values = pages[:, :, 1].reshape(rows, -1, num_kv_heads, head_dim).float()
        grouped = q.float().view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
        scores = torch.einsum("bkgd,bskd->bkgs", grouped, keys) * scale
        past = self._key_positions[None, :] >= self.seq_lens[:rows, None]  # [rows, S]
        scores = scores.masked_fill(past[:, None, None, :], float("-inf"))
        values = values.masked_fill(past[:, :, None, None], 0.0)  # a slot past the length may hold anything
        out = torch.einsum("bkgs,bskd->bkgd", scores.softmax(-1), values)
        return out.reshape(rows, num_heads, head_dim).to(q.dtype)

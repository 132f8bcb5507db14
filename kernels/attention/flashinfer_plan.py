"""The host-side half of the FlashInfer backend's plan: one step's page table in FlashInfer's CSR form.

Plain torch on the CPU (no flashinfer, no CUDA), so that it is unit-tested anywhere. Every array is int32
and lives in ONE host buffer (pinned when the step runs on CUDA), so the arrays ``append_paged_kv_cache``
reads on the device cost one host-to-device copy per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class PageTable:
    """A step's batch as FlashInfer takes it (views into ``buffer``).

    ``qo_indptr`` ``[n+1]``: sequence i's query tokens are ``qo_indptr[i]:qo_indptr[i+1]``.
    ``kv_indptr`` ``[n+1]``, ``kv_indices`` ``[kv_indptr[n]]``: sequence i's pages, in position order,
    are ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` (the first ``ceil(seq_len / page_size)`` entries of
    its block table row). ``kv_last_page_len`` ``[n]``: valid slots of its last page (1..page_size).
    ``batch_indices`` and ``positions`` ``[T]``: the sequence and the absolute position of each new
    token, what ``append_paged_kv_cache`` needs to place the step's K/V.
    """

    buffer: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor

    @property
    def num_seqs(self) -> int:
        return self.kv_last_page_len.numel()

    def on(self, device: torch.device) -> PageTable:
        """The same arrays on ``device``: one (non-blocking, when pinned) copy of the whole buffer."""
        buffer = self.buffer.to(device, non_blocking=self.buffer.is_pinned())
        return _views(buffer, self.num_seqs, self.kv_indices.numel(), self.positions.numel())


def build_page_table(meta: AttentionMetadata, pin_memory: bool = False) -> PageTable:
    """The page table of ``meta``'s step, built from host-side lengths and ``meta.tables_on_host()``."""
    n, page = meta.num_seqs, meta.block_size
    seq_lens = torch.tensor(meta.seq_lens, dtype=torch.int64)
    query_lens = torch.tensor(meta.query_lens, dtype=torch.int64)
    pages = (seq_lens + page - 1) // page
    tables = meta.tables_on_host()
    used = torch.arange(tables.shape[1]) < pages[:, None]
    kv_indices = tables[used]  # row-major: each sequence's pages in order, sequences in batch order
    num_tokens, num_pages = meta.num_tokens, int(pages.sum())
    buffer = torch.empty(3 * n + 2 + num_pages + 2 * num_tokens, dtype=torch.int32, pin_memory=pin_memory)
    views = _views(buffer, n, num_pages, num_tokens)
    views.qo_indptr.copy_(torch.tensor(meta.query_starts, dtype=torch.int32))
    views.kv_indptr[0] = 0
    views.kv_indptr[1:].copy_(torch.cumsum(pages, 0))
    views.kv_indices.copy_(kv_indices)
    views.kv_last_page_len.copy_(seq_lens - (pages - 1) * page)
    seq_of_token = torch.repeat_interleave(torch.arange(n), query_lens)
    views.batch_indices.copy_(seq_of_token)
    first = torch.tensor(meta.query_starts[:-1], dtype=torch.int64)
    context = torch.tensor(meta.context_lens, dtype=torch.int64)
    views.positions.copy_(context[seq_of_token] + torch.arange(num_tokens) - first[seq_of_token])
    return views


def _views(buffer: torch.Tensor, n: int, num_pages: int, num_tokens: int) -> PageTable:
    sizes = [n + 1, n + 1, num_pages, n, num_tokens, num_tokens]
    qo, kv_ptr, kv_idx, last, batch, pos = buffer[: sum(sizes)].split(sizes)
    return PageTable(buffer, qo, kv_ptr, kv_idx, last, batch, pos)

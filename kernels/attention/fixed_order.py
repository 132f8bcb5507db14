"""CPU paged attention whose result for a query does not depend on the step it runs in (deterministic mode).

The default CPU backend (``cpu_native``) serves decode rows with the C kernel, which splits a sequence's
KV across threads when there are few sequences (so a row's reduction order depends on the batch size), and
prefill rows with torch's ``scaled_dot_product_attention`` (another kernel, another order, which also
changes with the chunk and with a prefix hit). This backend instead writes the step's K/V into the cache
first, then runs every query row, decode or prefill, through the same C kernel as a sequence of its own
(length = its position + 1) without split-KV: each query sums its positions in one order — blocks and
tiles ascending, float32 online softmax — whatever shares its step, where its chunk starts, or which node
runs it. The price is prefill: every prefill row reads its whole prefix from the cache.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kernels.attention.base import AttentionBackend, kv_rows, write_kv_rows
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.native_cpu import NATIVE_DTYPES, _library
from kernels.attention.registry import BackendUnavailableError


class FixedOrderCpuAttention(AttentionBackend):
    """Every query row of a step as its own sequence of the C decode kernel, one thread per row (rows in
    parallel). Needs a CPU, a contiguous bf16/fp32 cache and a shape the kernel serves; anything else is
    refused (``ValueError``) rather than served with another reduction order."""

    name: ClassVar[str] = "cpu_fixed_order"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if self.device.type != "cpu":
            raise BackendUnavailableError(f"attention backend {self.name!r} runs on CPU only, not {self.device}")
        self._library = _library()
        self._rows: torch.Tensor | None = None
        self._tables: torch.Tensor | None = None
        self._lens: torch.Tensor | None = None
        self._highest_block = -1

    @classmethod
    def check_available(cls) -> None:
        _library()

    def plan(self, meta: AttentionMetadata) -> None:
        token_seq, lens = [], []
        for i, (query_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens, strict=True)):
            token_seq.extend([i] * query_len)
            lens.extend(range(seq_len - query_len + 1, seq_len + 1))
        widest = -(-max(lens) // meta.block_size) if lens else 1
        tables = meta.tables_on_host()[torch.tensor(token_seq, dtype=torch.long)][:, :widest]
        self._tables = tables.to(torch.int32).contiguous()
        self._lens = torch.tensor(lens, dtype=torch.int32)
        self._rows = kv_rows(meta.slot_mapping.cpu(), meta.block_size).contiguous()
        highest = int(self._tables.max()) if self._tables.numel() else 0
        lowest = int(self._tables.min()) if self._tables.numel() else 0
        if lowest < 0:
            raise ValueError(f"negative block in the step's metadata ({lowest})")
        self._highest_block = max(highest, int(meta.slot_mapping.max()) // meta.block_size if lens else 0)
        self._block_size = meta.block_size

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        if self._rows is None or self._tables is None or self._lens is None:
            raise RuntimeError("FixedOrderCpuAttention.forward called before plan()")
        num_tokens, num_heads, head_dim = q.shape
        if num_tokens != self._lens.numel():
            raise ValueError(f"planned {self._lens.numel()} tokens, got q of {num_tokens}")
        self._check(q, kv_cache)
        write_kv_rows(kv_cache, k, v, self._rows)
        q = q.contiguous()
        out = torch.empty_like(q)
        kernel = self._library.paged_decode_bf16 if q.dtype == torch.bfloat16 else self._library.paged_decode_f32
        status = kernel(
            q.data_ptr(), None, None, None, kv_cache.data_ptr(), self._tables.data_ptr(), self._lens.data_ptr(),
            num_tokens, self._tables.shape[1], num_heads, kv_cache.shape[3], head_dim, kv_cache.shape[2], scale,
            out.data_ptr(), torch.get_num_threads(), 1,
        )
        if status != 0:
            raise RuntimeError(f"paged_decode failed with status {status} (q {list(q.shape)}, "
                               f"cache {list(kv_cache.shape)})")
        return out

    def _check(self, q: torch.Tensor, kv_cache: torch.Tensor) -> None:
        fits = (kv_cache.device.type == "cpu" and q.device.type == "cpu" and kv_cache.dtype in NATIVE_DTYPES
                and q.dtype == kv_cache.dtype and kv_cache.is_contiguous() and q.shape[2] == kv_cache.shape[4]
                and q.shape[1] % kv_cache.shape[3] == 0
                and self._library.paged_decode_supports(q.shape[1], kv_cache.shape[3], q.shape[2], kv_cache.shape[2]))
        if not fits:
            raise ValueError(f"{self.name} cannot serve q {q.dtype} {list(q.shape)} over a cache "
                             f"{kv_cache.dtype} {list(kv_cache.shape)} (CPU, contiguous bf16/float32 only)")
        if self._highest_block >= kv_cache.shape[0] or self._block_size != kv_cache.shape[2]:
            raise ValueError(f"the step uses block {self._highest_block} of {self._block_size} slots; "
                             f"the cache is {list(kv_cache.shape)}")

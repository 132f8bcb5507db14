"""FlashInfer's decode in its CUDA-graph mode (:class:`GraphDecodeAttention`).

One ``BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True)`` per captured batch size, all over the same
fixed device buffers (page-table CSR: ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``; and each row's
position for ``append_paged_kv_cache``) and the same float workspace: only one size replays at a time.
``plan`` (outside the graph) builds the step's page table on the pinned host (``flashinfer_plan``), copies
the positions, and plans that size's wrapper, which copies the CSR arrays into the buffers it was built
with; ``forward`` (captured) appends and runs. A batch row's index in ``append_paged_kv_cache`` is its
row, so ``batch_indices`` is a constant ``arange``.
"""

from __future__ import annotations

from types import ModuleType

import torch

from kernels.attention.flashinfer import WORKSPACE_MIB, import_flashinfer
from kernels.attention.flashinfer_plan import PageTable, build_page_table
from kernels.attention.graph_decode import GraphDecodeAttention
from kernels.attention.metadata import AttentionMetadata


class FlashInferGraphDecode(GraphDecodeAttention):
    """``batch_sizes``: the sizes graphs are captured for (one wrapper each); ``heads``: ``(Hq, Hkv, D)``;
    ``scale``: the softmax scale the model passes to ``forward`` (FlashInfer takes it at plan time)."""

    name = "flashinfer"

    def __init__(self, device: torch.device | str, batch_sizes: tuple[int, ...], max_pages: int, block_size: int,
                 heads: tuple[int, int, int], dtype: torch.dtype, scale: float, *, tensor_cores: bool = True,
                 workspace_mib: int = WORKSPACE_MIB, flashinfer_module: ModuleType | None = None):
        self.device = torch.device(device)
        self._fi = flashinfer_module or import_flashinfer()
        self.max_batch, self.max_pages, self.block_size = max(batch_sizes), max_pages, block_size
        self.heads, self.dtype, self.scale = heads, dtype, scale
        int32 = {"dtype": torch.int32, "device": self.device}
        self.kv_indptr = torch.zeros(self.max_batch + 1, **int32)
        self.kv_indices = torch.zeros(self.max_batch * max_pages, **int32)
        self.kv_last_page_len = torch.ones(self.max_batch, **int32)
        self.positions = torch.zeros(self.max_batch, **int32)
        self.batch_indices = torch.arange(self.max_batch, **int32)
        workspace = torch.zeros(workspace_mib << 20, dtype=torch.uint8, device=self.device)
        self._wrappers = {
            size: self._fi.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                paged_kv_indptr_buffer=self.kv_indptr[:size + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:size])
            for size in batch_sizes
        }
        self._host: PageTable | None = None  # the pinned source of the last plan's copies: kept alive until the next
        self._rows = 0

    def plan(self, meta: AttentionMetadata) -> None:
        self.check_step(meta)
        wrapper = self._wrappers.get(meta.num_seqs)
        if wrapper is None:
            raise ValueError(f"no graph of {meta.num_seqs} rows; captured sizes: {sorted(self._wrappers)}")
        host = build_page_table(meta, pin_memory=self.device.type == "cuda")
        self._host = host
        self._rows = meta.num_seqs
        self.positions[:meta.num_seqs].copy_(host.positions, non_blocking=True)
        num_heads, num_kv_heads, head_dim = self.heads
        wrapper.plan(host.kv_indptr, host.kv_indices, host.kv_last_page_len, num_heads, num_kv_heads, head_dim,
                     self.block_size, pos_encoding_mode="NONE", q_data_type=self.dtype, kv_data_type=self.dtype,
                     sm_scale=self.scale)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                scale: float) -> torch.Tensor:
        rows = q.shape[0]
        if scale != self.scale:
            raise ValueError(f"planned for scale {self.scale}, got {scale}")
        self._fi.append_paged_kv_cache(
            k.contiguous(), v.contiguous(), self.batch_indices[:rows], self.positions[:rows], kv_cache,
            self.kv_indices, self.kv_indptr[:rows + 1], self.kv_last_page_len[:rows], kv_layout="NHD")
        return self._wrappers[rows].run(q.contiguous(), kv_cache)

"""FlashInfer's decode in its CUDA-graph mode (:class:`GraphDecodeAttention`).

One ``BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True)`` per captured batch size, all over the same
fixed device buffers (page-table CSR: ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``; and each row's
position for ``append_paged_kv_cache``) and the same float workspace: only one size replays at a time.
``plan`` (outside the graph) builds the step's page table on the pinned host (``flashinfer_plan``) and
sends it to the device in one copy, copies the positions there, and plans that size's wrapper with
``indptr`` and ``last_page_len`` from the host (its scheduler reads them) and the page indices already on
the device (copied into its buffer without a sync, as vLLM passes them); ``forward`` (captured) appends and
runs. A batch row's index in ``append_paged_kv_cache`` is its row, so ``batch_indices`` is a constant
``arange``.

The float workspace holds the split-KV partial results, which the CUDA-graph mode always has: its
scheduler pads the work to ``ceil(rows * group / 16) + rows - 1`` tiles of 16 query rows, each with a float
partial output per query head (:func:`workspace_bytes`; a too small one fails the plan with "Buffer
overflow", and the node then runs eagerly).
"""

from __future__ import annotations

from types import ModuleType

import torch

from kernels.attention.flashinfer import import_flashinfer
from kernels.attention.flashinfer_plan import PageTable, build_page_table
from kernels.attention.graph_decode import GraphDecodeAttention
from kernels.attention.metadata import AttentionMetadata

GRAPH_WORKSPACE_MIB = 384
"""The least float workspace of the graph wrappers (SGLang's default for FlashInfer)."""


def workspace_bytes(max_batch: int, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """Float workspace for graph decode of up to ``max_batch`` rows: twice the split-KV scratch estimate
    (module docstring), at least :data:`GRAPH_WORKSPACE_MIB`."""
    tiles = -(-max_batch * (num_heads // num_kv_heads) // 16) + max_batch - 1
    scratch = num_heads * tiles * 16 * (head_dim + 1) * 4  # partial outputs and their log-sum-exps, float32
    return max(GRAPH_WORKSPACE_MIB << 20, 2 * scratch)


class FlashInferGraphDecode(GraphDecodeAttention):
    """``batch_sizes``: the sizes graphs are captured for (one wrapper each); ``heads``: ``(Hq, Hkv, D)``;
    ``scale``: the softmax scale the model passes to ``forward`` (FlashInfer takes it at plan time)."""

    name = "flashinfer"

    def __init__(self, device: torch.device | str, batch_sizes: tuple[int, ...], max_pages: int, block_size: int,
                 heads: tuple[int, int, int], dtype: torch.dtype, scale: float, *, tensor_cores: bool = True,
                 flashinfer_module: ModuleType | None = None):
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
        workspace = torch.zeros(workspace_bytes(self.max_batch, *heads), dtype=torch.uint8, device=self.device)
        self._wrappers = {
            size: self._fi.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                paged_kv_indptr_buffer=self.kv_indptr[:size + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:size])
            for size in batch_sizes
        }
        self._tables: tuple[PageTable, PageTable] | None = None  # the last plan's, on the host and the device:
        # alive until the next plan (copies from them may be pending until the step's logits are read)

    def plan(self, meta: AttentionMetadata) -> None:
        self.check_step(meta)
        wrapper = self._wrappers.get(meta.num_seqs)
        if wrapper is None:
            raise ValueError(f"no graph of {meta.num_seqs} rows; captured sizes: {sorted(self._wrappers)}")
        host = build_page_table(meta, pin_memory=self.device.type == "cuda")
        table = host.on(self.device)
        self._tables = (host, table)
        self.positions[:meta.num_seqs].copy_(table.positions)
        num_heads, num_kv_heads, head_dim = self.heads
        wrapper.plan(host.kv_indptr, table.kv_indices, host.kv_last_page_len, num_heads, num_kv_heads, head_dim,
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

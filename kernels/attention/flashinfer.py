"""Paged attention on CUDA through FlashInfer (``pip install 'pdserve[gpu]'``), imported lazily.

The cache ``[num_blocks, 2, block_size, Hkv, D]`` is FlashInfer's ``NHD`` paged layout with K and V on
dim 1, so the pool is used as it is. Per step, ``plan`` builds the page table on the host (int32, one
pinned buffer, see ``flashinfer_plan``) and sends it to the device in one copy; the first ``forward`` of
the step plans the FlashInfer wrapper for the layer shapes it sees, and every later layer reuses that
plan. A step whose sequences all decode one token runs ``BatchDecodeWithPagedKVCacheWrapper``; any other
step (prefill, with or without a cached prefix, or prefill mixed with decode) runs
``BatchPrefillWithPagedKVCacheWrapper`` with ``causal=True``, whose mask FlashInfer aligns bottom-right
(query j of a sequence at position ``seq_len - query_len + j`` sees positions ``0..that``). New K/V go
into the cache with FlashInfer's ``append_paged_kv_cache``.

Sliding-window layers (``forward(..., window=W)``) run their own pair of wrappers, planned once per step
with ``window_left = W - 1`` (FlashInfer's count of positions left of the query that it sees: transformers'
window of W), so that the full and the sliding layers of a step are not re-planned layer by layer. Layers
with attention sinks (GPT-OSS) or a logit softcap (Gemma 2) run the torch backend: FlashInfer's sink variant
and its ``logits_soft_cap`` are not wired (no GPU to check them against here).

FlashInfer runs fp16/bf16 with head dims 64, 128 and 256; other steps (float32, the exact-parity mode)
run the pure-torch backend on the same device. Nothing here imports flashinfer on a CPU-only install:
``check_available`` looks for CUDA first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import torch

from kernels.attention.base import AttentionBackend
from kernels.attention.flashinfer_plan import PageTable, build_page_table
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import BackendUnavailableError
from kernels.attention.torch_paged import TorchPagedAttention

log = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)
WORKSPACE_MIB = 128
"""FlashInfer's float workspace (split-KV partial results), the size its documentation recommends."""


def import_flashinfer() -> ModuleType:
    """The ``flashinfer`` module, or ``BackendUnavailableError`` saying why it does not import."""
    try:
        import flashinfer
    except (ImportError, OSError, RuntimeError) as exc:  # OSError/RuntimeError: a CUDA library it loads is missing
        raise BackendUnavailableError(
            f"attention backend 'flashinfer' is unavailable: importing flashinfer failed ({exc}); "
            f"kernels.attention.flashinfer needs CUDA and the 'gpu' extra (pip install 'pdserve[gpu]')"
        ) from exc
    return flashinfer


@dataclass
class _Step:
    meta: AttentionMetadata
    table: PageTable
    """The page table on the device (what ``append_paged_kv_cache`` reads)."""
    host: PageTable
    """The same arrays on the (pinned) host, for the wrappers' ``plan``."""
    decode_only: bool
    planned_for: dict[int | None, tuple[Any, ...]] = field(default_factory=dict)
    """Per window (None: full attention), the layer shapes its wrapper was planned for in this step."""
    torch_planned: bool = False


class FlashInferBackend(AttentionBackend):
    """FlashInfer paged attention (CUDA, bf16/fp16); steps it cannot run go to ``TorchPagedAttention``.

    ``prefill_backend``: FlashInfer's prefill implementation: ``"auto"`` (default: ``fa3`` on Hopper, whose
    4k-token prefill ran 1.5-1.8x faster than ``fa2`` on an H200, ``fa2`` elsewhere), ``"fa2"`` or ``"fa3"``.
    ``decode_tensor_cores``: decode through the fa2 prefill kernels' tensor-core path (good for GQA).
    """

    name: ClassVar[str] = "flashinfer"
    supports_window: ClassVar[bool] = True
    supports_sinks: ClassVar[bool] = True  # on the torch backend: FlashInfer's sink variant is not wired yet
    supports_softcap: ClassVar[bool] = True  # on the torch backend: its logits_soft_cap is not wired yet

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        prefill_backend: str = "auto",
        decode_tensor_cores: bool = True,
        workspace_mib: int = WORKSPACE_MIB,
        flashinfer_module: ModuleType | None = None,
    ) -> None:
        """``flashinfer_module``: a stand-in for ``flashinfer`` (tests run the plumbing on the CPU with one)."""
        self.device = torch.device(device if device is not None else "cuda")
        if flashinfer_module is None:
            if self.device.type != "cuda":
                raise BackendUnavailableError(
                    f"attention backend 'flashinfer' runs on CUDA devices only, not {self.device}; "
                    f"kernels.attention.flashinfer is the GPU path (use 'torch' or 'cpu_native' here)")
            self.check_available()
            flashinfer_module = import_flashinfer()
        self._fi = flashinfer_module
        self._workspace = torch.zeros(workspace_mib << 20, dtype=torch.uint8, device=self.device)
        self._prefill_backend, self._decode_tensor_cores = prefill_backend, decode_tensor_cores
        self._wrappers: dict[int | None, tuple[Any, Any]] = {}
        self._prefill, self._decode = self._wrappers_for(None)
        self._torch = TorchPagedAttention(self.device)
        self._step: _Step | None = None
        self._warned: set[tuple[Any, ...]] = set()

    @classmethod
    def check_available(cls) -> None:
        """Raises ``BackendUnavailableError`` without CUDA (flashinfer is then not even imported), or when
        flashinfer does not import."""
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                "attention backend 'flashinfer' is unavailable: no CUDA device here "
                "(kernels.attention.flashinfer runs on CUDA only; 'torch' and 'cpu_native' run on CPUs)")
        import_flashinfer()

    def _wrappers_for(self, window: int | None) -> tuple[Any, Any]:
        """The (prefill, decode) wrappers of layers with ``window`` (made on first use; one float workspace)."""
        if window not in self._wrappers:
            fi = self._fi
            self._wrappers[window] = (
                fi.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", backend=self._prefill_backend),
                fi.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD",
                                                      use_tensor_cores=self._decode_tensor_cores))
        return self._wrappers[window]

    def plan(self, meta: AttentionMetadata) -> None:
        host = build_page_table(meta, pin_memory=self.device.type == "cuda")
        self._step = _Step(meta, host.on(self.device), host, decode_only=not meta.prefill_seqs)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float,
        window: int | None = None, sinks: torch.Tensor | None = None, softcap: float | None = None,
    ) -> torch.Tensor:
        step = self._step
        if step is None:
            raise RuntimeError("FlashInferBackend.forward called before plan()")
        num_tokens, num_heads, head_dim = q.shape
        _, two, block_size, num_kv_heads, cache_head_dim = kv_cache.shape
        if num_tokens != step.meta.num_tokens:
            raise ValueError(f"planned {step.meta.num_tokens} tokens, got q of {num_tokens}")
        if two != 2 or num_heads % num_kv_heads or cache_head_dim != head_dim or block_size != step.meta.block_size:
            raise ValueError(f"q {list(q.shape)} does not fit kv_cache {list(kv_cache.shape)} "
                             f"(block size {step.meta.block_size} planned)")
        if window is not None and window >= step.meta.max_seq_len:
            window = None  # it hides nothing in this step: the full layers' plan serves it
        if sinks is not None or softcap is not None:
            return self._torch_forward(step, q, k, v, kv_cache, scale, window, sinks, softcap)
        if not self._runs(q, kv_cache):
            return self._torch_forward(step, q, k, v, kv_cache, scale, window)
        shapes = (num_heads, num_kv_heads, head_dim, block_size, q.dtype, scale)
        if step.planned_for.get(window) != shapes:
            self._plan_wrapper(step, shapes, window)
        table = step.table
        self._fi.append_paged_kv_cache(
            k.contiguous(), v.contiguous(), table.batch_indices, table.positions, kv_cache,
            table.kv_indices, table.kv_indptr, table.kv_last_page_len, kv_layout="NHD")
        prefill, decode = self._wrappers_for(window)
        wrapper = decode if step.decode_only else prefill
        return wrapper.run(q.contiguous(), kv_cache)

    def _runs(self, q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        fits = (q.device.type == self.device.type and q.dtype in SUPPORTED_DTYPES and kv_cache.dtype == q.dtype
                and q.shape[2] in SUPPORTED_HEAD_DIMS and kv_cache.is_contiguous())
        if not fits:
            why = (q.dtype, kv_cache.dtype, q.shape[2], kv_cache.is_contiguous())
            if why not in self._warned:
                self._warned.add(why)
                log.info("flashinfer: %s, head dim %d, contiguous cache %s: running the torch backend",
                         q.dtype, q.shape[2], kv_cache.is_contiguous())
        return fits

    def _plan_wrapper(self, step: _Step, shapes: tuple[Any, ...], window: int | None) -> None:
        num_heads, num_kv_heads, head_dim, block_size, dtype, scale = shapes
        host, window_left = step.host, -1 if window is None else window - 1
        prefill, decode = self._wrappers_for(window)
        if step.decode_only:
            decode.plan(host.kv_indptr, host.kv_indices, host.kv_last_page_len, num_heads, num_kv_heads,
                        head_dim, block_size, pos_encoding_mode="NONE", window_left=window_left, q_data_type=dtype,
                        kv_data_type=dtype, sm_scale=scale)
        else:
            prefill.plan(host.qo_indptr, host.kv_indptr, host.kv_indices, host.kv_last_page_len, num_heads,
                         num_kv_heads, head_dim, block_size, causal=True, pos_encoding_mode="NONE",
                         window_left=window_left, sm_scale=scale, q_data_type=dtype, kv_data_type=dtype)
        step.planned_for[window] = shapes

    def _torch_forward(self, step: _Step, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       kv_cache: torch.Tensor, scale: float, window: int | None,
                       sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
        if not step.torch_planned:
            self._torch.plan(step.meta)
            step.torch_planned = True
        return self._torch.forward(q, k, v, kv_cache, scale, window=window, sinks=sinks, softcap=softcap)

"""CUDA IPC for KV pools: export a pool's memory handle, map a peer's pool, probe the mapping, copy blocks.

The handle is torch's own CUDA IPC reduction (``torch.multiprocessing.reductions.reduce_tensor``) carried
field by field in :class:`CudaIpcTensor`, never pickled, so a peer's message cannot run code here. A
mapping is trusted only after the probe: the exporter fills a small tensor with a pattern derived from a
nonce, the importer reads it through its mapping and both compare digests. One of the few torch modules
of this package; everything except ``export_tensor``/``open_tensor`` also runs on CPU tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

PROBE_BYTES = 4096
_PROBE_DOMAIN = b"pdserve-kv-ipc-probe:"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "uint8": torch.uint8}


class IpcError(RuntimeError):
    """A CUDA IPC mapping or copy failed; the caller falls back to moving bytes."""


@dataclass(frozen=True)
class CudaIpcTensor:
    """What another process on the same GPU needs to map a CUDA tensor (torch's IPC reduction)."""

    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    """Empty when the exporter had no event to share."""
    event_sync_required: bool
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    """The tensor's offset in its storage, in elements."""
    dtype: str
    """A key of ``DTYPES``."""


def gpu_uuid(device: torch.device | str | int) -> str:
    """The UUID of a CUDA device (stable across processes, unlike its index under CUDA_VISIBLE_DEVICES)."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise IpcError(f"{device} is not a CUDA device here")
    return str(torch.cuda.get_device_properties(device).uuid)


def export_tensor(tensor: torch.Tensor) -> CudaIpcTensor:
    """The IPC handle of a CUDA tensor. The tensor must stay alive while peers map it."""
    from torch.multiprocessing.reductions import reduce_tensor

    if tensor.device.type != "cuda":
        raise IpcError(f"only CUDA tensors have IPC handles, not {tensor.device}")
    dtype = next((name for name, d in DTYPES.items() if d == tensor.dtype), None)
    if dtype is None:
        raise IpcError(f"unsupported dtype {tensor.dtype}")
    _rebuild, args = reduce_tensor(tensor)
    (_cls, size, stride, offset, _storage_cls, _dtype, _device, handle, storage_size, storage_offset,
     _requires_grad, ref_counter_handle, ref_counter_offset, event_handle, event_sync_required) = args
    return CudaIpcTensor(
        handle=bytes(handle), storage_size_bytes=int(storage_size), storage_offset_bytes=int(storage_offset),
        ref_counter_handle=bytes(ref_counter_handle or b""), ref_counter_offset=int(ref_counter_offset),
        event_handle=bytes(event_handle or b""), event_sync_required=bool(event_sync_required),
        shape=tuple(size), stride=tuple(stride), offset=int(offset), dtype=dtype)


def open_tensor(exported: CudaIpcTensor, device: torch.device | str | int) -> torch.Tensor:
    """Map a peer's exported tensor on ``device`` (this process's index of the same GPU). Raises
    :class:`IpcError` when CUDA refuses (another GPU, another host, the same process, a stale handle)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if exported.dtype not in DTYPES:
        raise IpcError(f"unsupported dtype {exported.dtype!r}")
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    try:
        return rebuild_cuda_tensor(
            torch.Tensor, torch.Size(exported.shape), exported.stride, exported.offset, torch.storage.TypedStorage,
            DTYPES[exported.dtype], index, exported.handle, exported.storage_size_bytes,
            exported.storage_offset_bytes, False, exported.ref_counter_handle or None, exported.ref_counter_offset,
            exported.event_handle or None, exported.event_sync_required)
    except (RuntimeError, TypeError) as exc:  # RuntimeError: any CUDA error; TypeError: malformed handle fields
        raise IpcError(f"cannot map the peer's memory: {exc}") from exc


def probe_pattern(nonce: bytes, nbytes: int = PROBE_BYTES) -> bytes:
    """The bytes an exporter writes into its probe tensor for ``nonce``."""
    return hashlib.shake_256(_PROBE_DOMAIN + nonce).digest(nbytes)


def probe_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def make_probe(nonce: bytes, device: torch.device | str) -> torch.Tensor:
    """A ``uint8`` tensor holding ``probe_pattern(nonce)`` on ``device`` (keep it alive while exported)."""
    pattern = torch.frombuffer(bytearray(probe_pattern(nonce)), dtype=torch.uint8)
    return pattern.to(device)


def read_probe(probe: torch.Tensor) -> bytes:
    """What a probe tensor holds, read through whatever mapping it is (waits for the copy)."""
    return probe.to("cpu").contiguous().numpy().tobytes()


def check_pools_match(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Raises :class:`IpcError` unless both are KV pools ``[layers, blocks, ...]`` of one block layout."""
    if src.dim() < 3 or src.dtype != dst.dtype or src.shape[0] != dst.shape[0] or src.shape[2:] != dst.shape[2:]:
        raise IpcError(f"pool layouts differ: peer {list(src.shape)} {src.dtype}, here {list(dst.shape)} {dst.dtype}")


def copy_blocks(src_pool: torch.Tensor, dst_pool: torch.Tensor, src_ids: Sequence[int], dst_ids: Sequence[int],
                stream: torch.cuda.Stream | None = None) -> None:
    """``dst_pool[:, dst_ids[i]] = src_pool[:, src_ids[i]]`` for pools ``[layers, blocks, ...]`` of one
    block layout, on ``stream`` (CUDA; after the work queued on the default stream) or at once (CPU);
    returns once the copy is complete, so that the blocks may be used here and released there. Raises
    :class:`IpcError` on bad ids or a CUDA error."""
    if len(src_ids) != len(dst_ids):
        raise IpcError(f"{len(src_ids)} source blocks for {len(dst_ids)} destinations")
    check_pools_match(src_pool, dst_pool)
    for ids, pool, side in ((src_ids, src_pool, "source"), (dst_ids, dst_pool, "destination")):
        if ids and not 0 <= min(ids) <= max(ids) < pool.shape[1]:
            raise IpcError(f"{side} block ids {min(ids)}..{max(ids)} outside a pool of {pool.shape[1]} blocks")
    if not src_ids:
        return
    try:
        if dst_pool.device.type != "cuda":
            _copy(src_pool, dst_pool, src_ids, dst_ids)
            return
        stream = stream or torch.cuda.current_stream(dst_pool.device)
        # Torch's streams do not wait for the default stream by themselves: the engine's kernels queued
        # there (a late write into a block freed and just reserved again) must finish before the copy.
        stream.wait_stream(torch.cuda.default_stream(dst_pool.device))
        with torch.cuda.stream(stream):
            _copy(src_pool, dst_pool, src_ids, dst_ids)
        stream.synchronize()
    except RuntimeError as exc:
        raise IpcError(f"copying {len(src_ids)} blocks failed: {exc}") from exc


MAX_RUN_COPIES = 8
"""Past this many runs of consecutive ids, one gather and one scatter beat a strided copy per run."""


def block_runs(src_ids: Sequence[int], dst_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(source start, destination start, length)`` of each maximal run of pairs whose ids both go up by one."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src_ids, dst_ids, strict=True):
        if runs and s == runs[-1][0] + runs[-1][2] and d == runs[-1][1] + runs[-1][2]:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def _copy(src_pool: torch.Tensor, dst_pool: torch.Tensor, src_ids: Sequence[int], dst_ids: Sequence[int]) -> None:
    """On the current stream: a strided copy per run of consecutive blocks (each byte read and written once;
    a fresh pool hands out consecutive blocks), or, past :data:`MAX_RUN_COPIES` runs, one gather into a
    temporary and one scatter out of it."""
    runs = block_runs(src_ids, dst_ids)
    same_pool = src_pool.untyped_storage().data_ptr() == dst_pool.untyped_storage().data_ptr()
    if len(runs) <= MAX_RUN_COPIES and not same_pool:  # runs within one pool may overlap: through a temporary
        for s, d, n in runs:
            dst_pool[:, d:d + n].copy_(src_pool[:, s:s + n], non_blocking=True)
        return
    src = torch.tensor(list(src_ids), dtype=torch.long).to(src_pool.device, non_blocking=True)
    dst = torch.tensor(list(dst_ids), dtype=torch.long).to(dst_pool.device, non_blocking=True)
    dst_pool.index_copy_(1, dst, src_pool.index_select(1, src).to(dst_pool.device))

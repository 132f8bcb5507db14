"""Row-invariant bf16 projections on AMX tiles (``native/gemm_amx.c``): the deterministic mode's prompt rows.

oneDNN's bf16 products give a row the same bits only at one fixed row count, so without this kernel the
prompt rows run in zero-padded products of exactly ``PROMPT_ROW_BLOCK`` rows (:mod:`kernels.linear`). This
kernel sums each output over its inputs in one order whatever the row count (32 inputs per TDPBF16PS, in
fp32, rounded to bf16 once), so a chunk of any length runs without padding at the matrix units' speed.
It needs a CPU with AMX (Sapphire Rapids and later), a compiler that targets it, and Linux's permission
(asked once per process); :func:`amx_supported` says whether all hold. Its bits are not oneDNN's: a process
uses it for every prompt row or for none.

The weight is packed once into tiles of 16 outputs x 32 inputs in AMX's pair layout (as many bytes as the
dense weight): ``packed[nb, kb, r, c]`` holds ``W[16 nb + c, 32 kb + 2 r]`` and ``W[16 nb + c, 32 kb + 2 r + 1]``.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from kernels.attention.native.build import native_function


@dataclass(frozen=True)
class AmxWeight:
    packed: torch.Tensor  # int32 [out / 16, in / 32, 16, 16]
    out_features: int
    in_features: int
    bias: torch.Tensor | None  # float32 [out]


@functools.cache
def _kernel():
    pointer, c_int = ctypes.c_void_p, ctypes.c_int
    return native_function("gemm_amx_bf16", [pointer, c_int, c_int, pointer, c_int, pointer, pointer, c_int])


@functools.cache
def amx_supported() -> bool:
    """The kernel is built with AMX and this process may use the tiles (an empty product succeeds)."""
    kernel = _kernel()
    return kernel is not None and kernel(None, 0, 32, None, 16, None, None, 1) == 0


def pack_amx(weight: torch.Tensor, bias: torch.Tensor | None = None) -> AmxWeight | None:
    """``weight [out, in]`` bf16 on CPU packed for :func:`amx_linear`; None where the kernel does not serve
    it (no AMX here, another dtype or device, ``in`` not a multiple of 32 or ``out`` of 16)."""
    out_features, in_features = weight.shape
    if (weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or in_features % 32 or out_features % 16
            or not amx_supported()):
        return None
    tiles = weight.contiguous().view(out_features // 16, 16, in_features // 32, 16, 2).permute(0, 2, 3, 1, 4)
    packed = tiles.contiguous().view(torch.int32).view(out_features // 16, in_features // 32, 16, 16)
    return AmxWeight(packed, out_features, in_features, None if bias is None else bias.float().contiguous())


def amx_linear(x: torch.Tensor, weight: AmxWeight) -> torch.Tensor:
    """``x [T, in]`` bf16 → ``[T, out]`` bf16, each row's bits independent of ``T`` and of the other rows."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], weight.out_features, dtype=torch.bfloat16)
    bias = weight.bias.data_ptr() if weight.bias is not None else None
    status = _kernel()(x.data_ptr(), x.shape[0], weight.in_features, weight.packed.data_ptr(), weight.out_features,
                       bias, out.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"gemm_amx_bf16 failed with status {status} (x {list(x.shape)}, "
                           f"weight [{weight.out_features}, {weight.in_features}])")
    return out

"""Row-invariant 4-bit projections (``native/gemm_int4.c``): the deterministic mode's output rows.

torch's int4 kernel gives a row the same bits at any row count, but its cost grows with every row (here, the
bundled model's four projections: ~4 ms a step at one row, ~24 at 16, where oneDNN's dense product takes ~11);
the default mode leaves it above 8 rows, which the deterministic mode cannot (the switch changes a row's bits).
This kernel keeps one set of numbers at every row count and is faster than torch's at every count measured
(1-32 rows): calls of at most ``avx_max_rows`` rows run AVX512 (VPDPWSSD on int16 multiples of the grid below;
2.3 ms at one row, 11 at 12), larger ones the AMX tiles, which turn each weight tile's codes into a bf16 tile
once for all the rows (13.5 ms at 16).

Both paths give the same bits because the sums they make are exact: per row and group of 32 inputs the inputs
are first put on the grid ``2^(e - 14)`` (``e`` the exponent of the group's largest ``|x|``; an input within
2^7 of it is unchanged, a smaller one loses what lies below 2^-15 of the largest), so every product with a
code and every partial sum is exact in fp32, whatever order the hardware adds them in. Then per group
``scale * dot + offset * sum``, groups in order, one rounding to bf16 at the end (``scale`` and ``offset``
as the file stores them, fp16). The error against the float64 product is one bf16 rounding of an fp32 sum
(more, relative to the output, where the output cancels), plus the grid's: nothing for inputs within 2^7 of
their group's largest. A NaN or an infinity in a row makes every output of that row NaN.

It needs AVX512-BF16 and VNNI (and AMX for the fast large calls: without it every call takes the AVX path,
with the same bits); :func:`int4_fixed_supported` says whether it runs here.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from kernels.attention.native.build import native_function
from kernels.int4_linear import GroupQuantized

AVX_MAX_ROWS = 12
"""Calls of at most this many rows take the AVX path, larger ones the tiles (measured: the tiles win above ~12
rows here; either gives the same bits)."""


@dataclass(frozen=True)
class Int4FixedWeight:
    """``codes[nb, kb, q, j]`` (int16) holds four codes, bits ``4 n`` of the code of ``W[16 nb + j // 2,
    32 kb + 2 (4 q + n) + j % 2]``: so the 32 codes of a pair of inputs for 16 outputs come out of 64 bytes
    with one shift and one mask, in the pair layout VPDPWSSD and TDPBF16PS read. ``params[nb, kb, 0, c]``:
    the scale, ``params[nb, kb, 1, c]`` the offset of output ``16 nb + c`` over group ``kb``, fp16 (exact for
    a GGUF file's, which are fp16)."""

    codes: torch.Tensor  # int16 [out / 16, in / 32, 4, 32]
    params: torch.Tensor  # float16 [out / 16, in / 32, 2, 16]
    out_features: int
    in_features: int
    bias: torch.Tensor | None  # float32 [out]


@functools.cache
def _kernel():
    pointer, c_int = ctypes.c_void_p, ctypes.c_int
    return native_function("gemm_int4_fixed",
                           [pointer, c_int, c_int, pointer, pointer, c_int, pointer, pointer, c_int, c_int])


@functools.cache
def int4_fixed_supported() -> bool:
    """The kernel is built with AVX512-BF16 here (a call of one row succeeds)."""
    kernel = _kernel()
    if kernel is None:
        return False
    x, out = torch.zeros(1, 32, dtype=torch.bfloat16), torch.empty(1, 16, dtype=torch.bfloat16)
    codes, params = torch.zeros(1, 1, 4, 32, dtype=torch.int16), torch.zeros(1, 1, 2, 16, dtype=torch.float16)
    return kernel(x.data_ptr(), 1, 32, codes.data_ptr(), params.data_ptr(), 16, None, out.data_ptr(), 1, 1) == 0


def pack_int4_fixed(weight: GroupQuantized, bias: torch.Tensor | None = None) -> Int4FixedWeight | None:
    """A 4-bit weight packed for :func:`int4_fixed_linear`; None where the kernel does not serve it (not
    supported here, groups of another size than 32, ``out`` not a multiple of 16)."""
    out_features, in_features = weight.shape
    if weight.group_size != 32 or out_features % 16 or not int4_fixed_supported():
        return None
    nb, kb = out_features // 16, in_features // 32
    lanes = weight.codes.view(nb, 16, kb, 4, 4, 2).permute(0, 2, 3, 4, 1, 5).to(torch.int32)  # [.., q, n, c, p]
    words = sum(lanes[:, :, :, n] << (4 * n) for n in range(4)).reshape(nb, kb, 4, 32)
    codes = words.contiguous().view(torch.int16)[..., ::2].contiguous()  # the low halves (little-endian)

    params = torch.stack([weight.scales, weight.offsets]).to(torch.float16).view(2, nb, 16, kb)
    return Int4FixedWeight(codes, params.permute(1, 3, 0, 2).contiguous(), out_features, in_features,
                           None if bias is None else bias.float().contiguous())


def int4_fixed_linear(x: torch.Tensor, weight: Int4FixedWeight, avx_max_rows: int = AVX_MAX_ROWS) -> torch.Tensor:
    """``x [T, in]`` bf16 → ``[T, out]`` bf16, each row's bits independent of ``T``, of the other rows and of
    ``avx_max_rows`` (for finite inputs whose groups' largest ``|x|`` is below 2^100)."""
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"int4_fixed_linear takes bf16 [T, {weight.in_features}] on the CPU, got {x.dtype} "
                         f"{list(x.shape)} on {x.device}")
    x = x.contiguous()
    out = torch.empty(x.shape[0], weight.out_features, dtype=torch.bfloat16)
    bias = weight.bias.data_ptr() if weight.bias is not None else None
    status = _kernel()(x.data_ptr(), x.shape[0], weight.in_features, weight.codes.data_ptr(),
                       weight.params.data_ptr(), weight.out_features, bias, out.data_ptr(), torch.get_num_threads(),
                       avx_max_rows)
    if status != 0:
        raise RuntimeError(f"gemm_int4_fixed failed with status {status} (x {list(x.shape)}, "
                           f"weight [{weight.out_features}, {weight.in_features}])")
    return out

"""Projections ``x @ W.T``: bf16 weights on CPU pre-packed for oneDNN, optionally 4-bit for few rows.

torch's plain ``F.linear`` on bf16 CPU tensors re-lays the weight out on every call; oneDNN's packed
("blocked") weight layout, the one TorchInductor uses, makes the same products 1.5–2.3× faster here
(measured at 1, 32 and 512 rows on this project's CPU, results bit-identical at 1 and 32 rows). float32
and GPU weights stay plain tensors with ``F.linear`` (float32 is the exact-parity mode).

A weight may also carry its 4-bit form (:mod:`kernels.int4_linear`, from a Q4 GGUF file): products of at
most ``int4_max_rows`` rows (small decode batches, bound by streaming the weight from memory) use it,
larger ones (prefill chunks, large batches, bound by arithmetic) use the dense weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.int4_linear import GroupQuantized, Int4Weight, int4_linear, pack_int4


@dataclass(frozen=True)
class LinearWeight:
    """A weight ``[out, in]`` ready for :func:`linear`: the plain tensor or oneDNN's packed form, and
    optionally its 4-bit form for products of at most ``int4_max_rows`` rows."""

    weight: torch.Tensor
    packed: bool
    out_features: int
    int4: Int4Weight | None = None
    int4_max_rows: int = 0
    bias: torch.Tensor | None = None  # added to every row (q/k/v biases of Qwen2)


def _packing_supported(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def prepare_linear(weight: torch.Tensor, pack: bool = True, int4: GroupQuantized | None = None,
                   int4_max_rows: int = 0, bias: torch.Tensor | None = None) -> LinearWeight:
    """``int4``: the same weight's 4-bit codes, used for products of at most ``int4_max_rows`` rows (the
    caller checks :func:`kernels.int4_linear.int4_supported`). ``bias``: ``[out]``, in the weight's dtype."""
    packed_int4 = pack_int4(int4, weight.dtype) if int4 is not None and int4_max_rows > 0 else None
    if packed_int4 is not None:
        assert (packed_int4.out_features, packed_int4.in_features) == tuple(weight.shape), (
            f"4-bit weight {int4.shape} differs from the dense one {tuple(weight.shape)}")
    if pack and _packing_supported(weight):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        return LinearWeight(packed, True, weight.shape[0], packed_int4, int4_max_rows, bias)
    return LinearWeight(weight.contiguous(), False, weight.shape[0], packed_int4, int4_max_rows, bias)


def linear(x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    """``x [T, in] @ W.T`` → ``[T, out]``."""
    if weight.int4 is not None and x.shape[0] <= weight.int4_max_rows:
        out = int4_linear(x, weight.int4)
        return out if weight.bias is None else out + weight.bias
    if weight.packed:
        return torch.ops.mkldnn._linear_pointwise(x, weight.weight, weight.bias, "none", [], "")
    return F.linear(x, weight.weight, weight.bias)

"""Dense projections ``x @ W.T``, with bf16 weights on CPU pre-packed for oneDNN.

torch's plain ``F.linear`` on bf16 CPU tensors re-lays the weight out on every call; oneDNN's packed
("blocked") weight layout, the one TorchInductor uses, makes the same products 1.5–2.3× faster here
(measured at 1, 32 and 512 rows on this project's CPU, results bit-identical at 1 and 32 rows). float32
and GPU weights stay plain tensors with ``F.linear`` (float32 is the exact-parity mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LinearWeight:
    """A weight ``[out, in]`` ready for :func:`linear`: the plain tensor or oneDNN's packed form."""

    weight: torch.Tensor
    packed: bool
    out_features: int


def _packing_supported(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def prepare_linear(weight: torch.Tensor, pack: bool = True) -> LinearWeight:
    if pack and _packing_supported(weight):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        return LinearWeight(packed, True, weight.shape[0])
    return LinearWeight(weight.contiguous(), False, weight.shape[0])


def linear(x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    """``x [T, in] @ W.T`` → ``[T, out]``."""
    if weight.packed:
        return torch.ops.mkldnn._linear_pointwise(x, weight.weight, None, "none", [], "")
    return F.linear(x, weight.weight)

"""RMS normalisation as Llama defines it: computed in float32, scaled by a learned weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension, returned in ``x.dtype`` (``weight`` None: a
    weightless norm).

    torch's fused kernel accumulates in float32 for bf16/fp16 inputs too, in one pass (the reference
    implementation instead casts the normalised value back to the input dtype before applying the
    weight: in bf16 the two round differently in the last bit, which the fast mode accepts).
    """
    return F.rms_norm(x, (x.shape[-1],), weight, eps)

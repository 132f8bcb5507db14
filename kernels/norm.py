"""RMS normalisation as Llama defines it: computed in float32, scaled by a learned weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension, returned in ``x.dtype``.

    For float32 inputs this is torch's fused kernel; lower precisions are normalised in float32 and cast
    back before the weight is applied, as the reference implementation does.
    """
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
    return normed * weight

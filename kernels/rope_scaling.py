"""Rotary frequencies of the RoPE variants Llama-family checkpoints use, computed as ``transformers`` does.

A checkpoint's ``rope_scaling`` (``rope_parameters`` in newer configs) names one of: ``default``,
``linear`` (positions interpolated by ``factor``), ``dynamic`` (NTK: equal to ``default`` within the
pre-training context, which is all pdserve serves of such a model), ``llama3`` (Llama 3.1+: low frequencies
divided by ``factor``, a smooth ramp between) and ``yarn`` (per-dimension blend of interpolation and
extrapolation plus an attention factor on cos/sin) and ``longrope`` (Phi-3.5, Phi-4-mini: per-dimension
``short_factor`` divisors and an attention factor from the context's growth; transformers switches to
``long_factor`` past ``original_max_position_embeddings``, which pdserve does not serve of such a model). GGUF
files of Llama 3.1+ carry the llama3 result as per-dimension divisors (``rope_freqs``): ``freq_factors``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")  # dynamic: plain rope within the context


class UnsupportedRopeError(ValueError):
    """A rope type or parameter that pdserve cannot compute exactly."""


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position: int | None = None  # llama3, yarn: the pre-training context
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: None = derived from factor (and mscale)
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    freq_factors: tuple[float, ...] | None = None  # GGUF rope_freqs: inv_freq is divided by these
    short_factor: tuple[float, ...] | None = None  # longrope: inv_freq's divisors within the original context

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedRopeError(
                f"rope type {self.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
        if self.rope_type in ("llama3", "yarn", "longrope") and not self.original_max_position:
            raise UnsupportedRopeError(f"rope type {self.rope_type!r} needs original_max_position_embeddings")
        if self.rope_type == "longrope" and not self.short_factor:
            raise UnsupportedRopeError("rope type 'longrope' needs short_factor")
        if self.factor <= 0:
            raise UnsupportedRopeError(f"rope scaling factor must be > 0, got {self.factor}")


def _default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    old_context = s.original_max_position
    low_wavelen, high_wavelen = old_context / s.low_freq_factor, old_context / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """Yarn's magnitude factor of a context grown ``scale`` times (DeepSeek's attention scale takes its square)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    if s.attention_factor is not None:
        attention = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        attention = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    else:
        attention = yarn_mscale(s.factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_max_position / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (s.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)


def _longrope(dim: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """transformers' longrope within the original context: the short factors, and its attention factor."""
    assert s.short_factor is not None and s.original_max_position
    if len(s.short_factor) != dim // 2:
        raise UnsupportedRopeError(f"longrope has {len(s.short_factor)} short factors, the rotary dim {dim} needs "
                                   f"{dim // 2}")
    if s.attention_factor is not None:
        attention = s.attention_factor
    else:
        attention = 1.0 if s.factor <= 1.0 else math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_position))
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(s.short_factor, dtype=torch.float32) * theta**shape), float(attention)


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> tuple[torch.Tensor, float]:
    """``inv_freq`` (float32, ``head_dim // 2``; ``head_dim``: the rotated dims) and the factor cos/sin are
    multiplied by."""
    s = scaling or RopeScaling()
    if s.rope_type == "yarn":
        inv_freq, attention = _yarn(head_dim, theta, s)
    elif s.rope_type == "longrope":
        inv_freq, attention = _longrope(head_dim, theta, s)
    else:
        inv_freq, attention = _default_inv_freq(head_dim, theta), 1.0
        if s.rope_type == "linear":
            inv_freq = inv_freq / s.factor
        elif s.rope_type == "llama3":
            inv_freq = _llama3(inv_freq, s)
    if s.freq_factors is not None:
        if len(s.freq_factors) != head_dim // 2:
            raise UnsupportedRopeError(f"rope_freqs has {len(s.freq_factors)} factors, expected {head_dim // 2}")
        inv_freq = inv_freq / torch.tensor(s.freq_factors, dtype=torch.float32)
    return inv_freq, attention

"""Rotary frequency tables (``inv_freq``) of the :mod:`kernels.rope_scaling` variants, computed as
``transformers`` does."""

from __future__ import annotations

import math

import torch

from kernels.rope_scaling import RopeScaling, UnsupportedRopeError, yarn_mscale


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


def _proportional(head_dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """transformers' proportional rope: the leading ``rotated_fraction`` of the ``head_dim // 2`` frequencies are the
    default ones of the whole head, the others 0 (those dims pass through: cos 1, sin 0), all divided by ``factor``."""
    angles = int(s.rotated_fraction * head_dim // 2)
    inv_freq = torch.zeros(head_dim // 2, dtype=torch.float32)
    inv_freq[:angles] = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim))
    return inv_freq / s.factor


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> tuple[torch.Tensor, float]:
    """``inv_freq`` (float32, ``head_dim // 2``; ``head_dim``: the rotated dims) and the factor cos/sin are
    multiplied by."""
    s = scaling or RopeScaling()
    if s.rope_type == "yarn":
        inv_freq, attention = _yarn(head_dim, theta, s)
    elif s.rope_type == "longrope":
        inv_freq, attention = _longrope(head_dim, theta, s)
    elif s.rope_type == "proportional":
        inv_freq, attention = _proportional(head_dim, theta, s), 1.0
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

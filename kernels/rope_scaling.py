"""The RoPE variants Llama-family checkpoints use, as ``transformers`` reads them. Torch-free: the configs of
processes that run no model (the gateway) carry them; :mod:`kernels.rope_frequencies` computes their tables.

A checkpoint's ``rope_scaling`` (``rope_parameters`` in newer configs) names one of: ``default``,
``linear`` (positions interpolated by ``factor``), ``dynamic`` (NTK: equal to ``default`` within the
pre-training context, which is all pdserve serves of such a model), ``llama3`` (Llama 3.1+: low frequencies
divided by ``factor``, a smooth ramp between) and ``yarn`` (per-dimension blend of interpolation and
extrapolation plus an attention factor on cos/sin), ``proportional`` (Gemma 4's full layers: the first
``partial_rotary_factor`` of each half of the head rotates with default frequencies of the whole head, the rest
not at all, all divided by ``factor``) and ``longrope`` (Phi-3.5, Phi-4-mini: per-dimension
``short_factor`` divisors and an attention factor from the context's growth; transformers switches to
``long_factor`` past ``original_max_position_embeddings``, which pdserve does not serve of such a model). GGUF
files of Llama 3.1+ carry the llama3 result as per-dimension divisors (``rope_freqs``): ``freq_factors``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# dynamic: plain rope within the context
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "proportional")


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
    rotated_fraction: float = 1.0  # proportional: the partial_rotary_factor of the frequencies that rotate

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedRopeError(
                f"rope type {self.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
        if self.rope_type in ("llama3", "yarn", "longrope") and not self.original_max_position:
            raise UnsupportedRopeError(f"rope type {self.rope_type!r} needs original_max_position_embeddings")
        if self.rope_type == "longrope" and not self.short_factor:
            raise UnsupportedRopeError("rope type 'longrope' needs short_factor")
        if not 0.0 <= self.rotated_fraction <= 1.0:
            raise UnsupportedRopeError(f"partial_rotary_factor must be in [0, 1], got {self.rotated_fraction}")
        if self.factor <= 0:
            raise UnsupportedRopeError(f"rope scaling factor must be > 0, got {self.factor}")


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """Yarn's magnitude factor of a context grown ``scale`` times (DeepSeek's attention scale takes its square)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

"""Rotary position embedding in the Hugging Face ("rotate half") layout used by Llama-family checkpoints, or
interleaved (GPT-J's pairs of adjacent dims; GLM-4's)."""

from __future__ import annotations

import torch

from kernels.rope_frequencies import rope_frequencies
from kernels.rope_scaling import RopeScaling


class RotaryEmbedding:
    """Precomputed cos/sin tables; :meth:`rotate` rotates q and k for a batch of absolute positions.

    Angles are computed in float32 exactly as ``transformers`` does (``inv_freq`` from ``theta`` and the
    checkpoint's rope scaling, outer product with positions, cos/sin times the scaling's attention factor),
    so float32 runs match the reference bit for bit where possible.

    The tables span the rotated dims (the whole head, or its leading ``rotary_dim``): ``cos`` is ``[cos | cos]``
    and ``sin`` is ``[-sin | sin]``, so that
    rotating is ``x * cos + roll(x, half) * sin``: 4 elementwise kernels instead of the 7 of halves and a
    concatenation, with the same bits in every dtype (a sign flip is exact, and each product and the sum
    are rounded as the half-by-half form rounds them).

    ``interleaved``: dims ``2i`` and ``2i + 1`` rotate together by angle ``i`` (transformers' GLM-4:
    ``[x0 * c0 - x1 * s0, x1 * c0 + x0 * s0, …]``); the tables are then ``[c0, c0, c1, c1, …]`` and
    ``[-s0, s0, -s1, s1, …]``, and the partner of each dim is its pair's other (:meth:`rotate`).
    """

    def __init__(self, head_dim: int, max_position: int, theta: float, device: torch.device | str = "cpu",
                 scaling: RopeScaling | None = None, rotary_dim: int | None = None, interleaved: bool = False):
        """``rotary_dim``: the leading dims of each head that rotate (a partial rotary factor; None: all)."""
        self.interleaved = interleaved
        self.rotary_dim = rotary_dim or head_dim
        assert self.rotary_dim % 2 == 0 and self.rotary_dim <= head_dim, f"bad rotary dim {rotary_dim} of {head_dim}"
        self.head_dim = head_dim
        self.max_position = max_position
        inv_freq, attention_factor = rope_frequencies(self.rotary_dim, theta, scaling)
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        if attention_factor != 1.0:
            cos, sin = cos * attention_factor, sin * attention_factor
        # float32 masters on the host; the device holds one copy per dtype the model asks for (a 131072-position
        # table of head dim 128 is 128 MiB in float32)
        if interleaved:
            self.cos = cos.repeat_interleave(2, dim=-1)
            self.sin = torch.stack((-sin, sin), dim=-1).flatten(-2)
        else:
            self.cos = torch.cat((cos, cos), dim=-1)
            self.sin = torch.cat((-sin, sin), dim=-1)
        self.device = torch.device(device)
        self._cast: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (see the class) for ``positions`` as ``[T, 1, rotary_dim]`` in ``dtype`` (gather once per
        step)."""
        if dtype not in self._cast:
            self._cast[dtype] = (self.cos.to(self.device, dtype), self.sin.to(self.device, dtype))
        cos, sin = self._cast[dtype]
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def frequency_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and ``sin`` of each position's ``rotary_dim / 2`` angles, float32 ``[max_position, half]``
        (a kernel's own layout is built from them)."""
        if self.interleaved:
            return self.cos[:, 0::2], self.sin[:, 1::2]
        half = self.rotary_dim // 2
        return self.cos[:, :half], self.sin[:, half:]

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """:meth:`apply` in this embedding's layout (rotate half, or interleaved pairs)."""
        if not self.interleaved:
            return RotaryEmbedding.apply(x, cos, sin)
        rotary = cos.shape[-1]
        if rotary < x.shape[-1]:
            return torch.cat((self.rotate(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
        partner = x.unflatten(-1, (rotary // 2, 2)).flip(-1).flatten(-2)
        return x * cos + partner * sin

    @staticmethod
    def rotate_half_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An interleaved embedding's step tables (:meth:`tables`) as :meth:`apply` takes the same angles (each
        pair's angle once per half): DeepSeek-V3.2's indexer rotates its keys so, beside the interleaved latent
        rope of the same frequencies."""
        cos, sin = cos[..., 0::2], sin[..., 1::2]
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``[T, H, head_dim]`` with tables from :meth:`tables` of a rotate-half embedding
        (an interleaved one's go through :meth:`rotate`) ("rotate half":
        ``[x1 * cos - x2 * sin | x2 * cos + x1 * sin]``); with tables narrower than the head (a partial rotary
        dim), its leading dims only, the rest passed through, as transformers does."""
        rotary = cos.shape[-1]
        if rotary < x.shape[-1]:
            return torch.cat((RotaryEmbedding.apply(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
        return x * cos + x.roll(rotary // 2, dims=-1) * sin

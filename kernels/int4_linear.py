"""4-bit group-quantised projections on CPU through torch's int4 weight-only matmul.

A weight ``W [out, in]`` is stored as 4-bit codes ``q`` in groups of ``group_size`` consecutive input
columns, each group with a scale ``d`` and an offset ``m``: ``W = d * q + m`` (``q`` in 0..15). This is
exactly GGUF's Q4_1 block (and Q4_0 with ``m = -8 d``), so a Q4 file's weights run without being
widened to 16 bits: a decode step then streams ~3.2× fewer weight bytes, which is what bounds it.

torch's kernel (``aten._weight_int4pack_mm_for_cpu``) computes ``x @ ((q - 8) * s + z).T`` with the
scale and zero in the activation dtype, so ``s = d`` and ``z = m + 8 d`` (rounded to bf16 once).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT4_OP = "_weight_int4pack_mm_for_cpu"


@dataclass(frozen=True)
class GroupQuantized:
    """``W = scales * codes + offsets`` per group of ``group_size`` input columns.

    ``codes`` is uint8 ``[out, in]`` with values 0..15; ``scales`` and ``offsets`` are float32
    ``[out, in // group_size]``.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    group_size: int

    def __post_init__(self) -> None:
        out_features, in_features = self.codes.shape
        groups = (out_features, in_features // self.group_size)
        assert in_features % self.group_size == 0, f"in_features {in_features} not a multiple of {self.group_size}"
        assert tuple(self.scales.shape) == groups and tuple(self.offsets.shape) == groups, (
            f"scales {tuple(self.scales.shape)} / offsets {tuple(self.offsets.shape)} must be {groups}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` these codes stand for."""
        out_features, in_features = self.codes.shape
        grouped = self.codes.view(out_features, -1, self.group_size).float()
        return (grouped * self.scales[..., None] + self.offsets[..., None]).view(out_features, in_features)

    def rows(self, index: torch.Tensor | slice) -> GroupQuantized:
        """The same weight restricted (or permuted) to some output rows."""
        return GroupQuantized(self.codes[index], self.scales[index], self.offsets[index], self.group_size)

    @staticmethod
    def cat(parts: list[GroupQuantized]) -> GroupQuantized:
        """Stack weights along their output rows (fused q/k/v or gate/up)."""
        sizes = {part.group_size for part in parts}
        assert len(sizes) == 1, f"cannot fuse weights of group sizes {sorted(sizes)}"
        return GroupQuantized(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                              torch.cat([p.offsets for p in parts]), sizes.pop())


@dataclass(frozen=True)
class Int4Weight:
    """A :class:`GroupQuantized` weight packed for torch's CPU int4 kernel."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor  # [in // group_size, out, 2] in the activation dtype
    group_size: int
    out_features: int
    in_features: int


def int4_supported(device: torch.device | str, dtype: torch.dtype) -> bool:
    """torch's int4 CPU kernel exists here and takes activations of ``dtype`` (bf16 is the fast mode)."""
    return (torch.device(device).type == "cpu" and dtype == torch.bfloat16
            and hasattr(torch.ops.aten, _INT4_OP))


def pack_int4(weight: GroupQuantized, dtype: torch.dtype = torch.bfloat16) -> Int4Weight:
    out_features, in_features = weight.shape
    assert out_features % 8 == 0 and in_features % 2 == 0, f"int4 packing needs out % 8 == 0, got {weight.shape}"
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.codes.to(torch.int32).contiguous(), 1)
    zeros = weight.offsets + 8 * weight.scales
    scales_and_zeros = torch.stack([weight.scales.t(), zeros.t()], dim=-1).to(dtype).contiguous()
    return Int4Weight(packed, scales_and_zeros, weight.group_size, out_features, in_features)


def int4_linear(x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    """``x [T, in] @ W.T`` → ``[T, out]`` in ``x``'s dtype."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), weight.packed, weight.group_size,
                                                      weight.scales_and_zeros)

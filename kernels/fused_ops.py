"""The decoder's elementwise work between its projections (residual add + RMSNorm, SiLU-and-multiply, rotary
embedding), as torch ops or as FlashInfer's fused kernels (CUDA, bf16/fp16): fewer launches per layer.

:func:`torch_ops` is the torch path, today's ops exactly (every CPU, float32 and deterministic model keeps its
bits). :data:`FLASHINFER_OPS` builds each FlashInfer kernel from a ``flashinfer`` module; the model takes one
only after :func:`kernels.fused_ops_check.choose` has run it against torch at load, op by op.

FlashInfer's semantics relied on (flashinfer-python 0.7.2.post1):

- ``fused_add_rmsnorm(input, residual, weight, eps)`` (``norm/__init__.py``, ``csrc/norm.cu``), in place:
  ``residual += input`` (rounded to the dtype), then ``input = rmsnorm(residual) * weight`` from the
  unrounded float32 sum; 2D ``[tokens, hidden]``, last dimension contiguous (any row stride), weight in the
  input's dtype.
- ``silu_and_mul(input)`` (``activation.py``, ``jit/activation.py``): a new ``[..., d]`` tensor
  ``silu(input[..., :d]) * input[..., d:]``; the kernel addresses row ``t`` at ``t * 2d`` without checking
  strides, so the input is made contiguous first.
- ``apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox=True)``
  (``rope.py``, ``csrc/rope.cu``): query/key ``[tokens, heads * head_size]`` (viewed as
  ``[tokens, heads, head_size]``; any token stride, last dimension contiguous) rotated in place; the cache is
  float32 ``[max_position, rotary_dim]``, cos in its first half and sin in its second; ``is_neox``: "rotate
  half" as :class:`~kernels.rope.RotaryEmbedding`, False its interleaved pairs (GPT-J's, GLM-4's); positions
  int32/int64, contiguous.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from kernels.norm import rms_norm
from kernels.rope import RotaryEmbedding

AddRmsNorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], None]
"""FlashInfer's ``fused_add_rmsnorm(input, residual, weight, eps)``: in place (see the module)."""
SiluAndMul = Callable[[torch.Tensor], torch.Tensor]


def torch_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up = [gate | up]`` (last dimension)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class TorchRope:
    """:class:`RotaryEmbedding`'s tables in the model dtype, gathered once per step, and its ``rotate``."""

    def __init__(self, rope: RotaryEmbedding, dtype: torch.dtype):
        self.rope, self.dtype = rope, dtype

    def prepare(self, positions: torch.Tensor) -> Any:
        return self.rope.tables(positions, self.dtype)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, step: Any) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = step
        return self.rope.rotate(q, cos, sin), self.rope.rotate(k, cos, sin)


class Float32Rope(TorchRope):
    """:class:`TorchRope` rotating in float32 with float32 tables, each rotation rounded once to q's and k's dtype
    (transformers' Llama 4, LFM3, OLMo, OLMo 2 and ERNIE 4.5 keep their cos and sin in float32)."""

    def __init__(self, rope: RotaryEmbedding):
        super().__init__(rope, torch.float32)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, step: Any) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = step
        return self.rope.rotate(q.float(), cos, sin).to(q.dtype), self.rope.rotate(k.float(), cos, sin).to(k.dtype)


def cos_sin_cache(rope: RotaryEmbedding) -> torch.Tensor:
    """FlashInfer's float32 ``[max_position, rotary_dim]`` table (cos half, then sin half) from ``rope``'s own
    float32 tables, so that its rope scaling (and attention factor) carries over; a partial rotary dim is the
    table's width, which FlashInfer's kernel reads as the dims it rotates."""
    return torch.cat(rope.frequency_tables(), dim=-1).contiguous()


class FlashInferRope:
    """Rotates q and k in place with FlashInfer's kernel over :func:`cos_sin_cache` (on the device)."""

    def __init__(self, apply_inplace: Callable[..., None], rope: RotaryEmbedding, device: torch.device):
        self._apply = apply_inplace
        self.head_dim = rope.head_dim
        self.is_neox = not rope.interleaved  # FlashInfer's name for rotate half (else GPT-J's interleaved pairs)
        self.cache = cos_sin_cache(rope).to(device)

    def prepare(self, positions: torch.Tensor) -> Any:
        return positions.contiguous()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, step: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [T, H, D]``, ``k [T, Hkv, D]`` (views of the qkv projection: each head's D contiguous) are
        returned rotated; ``view`` (never a copy) keeps the rotation in them."""
        self._apply(step, q.view(q.shape[0], -1), k.view(k.shape[0], -1), self.head_dim, self.cache,
                    is_neox=self.is_neox)
        return q, k


Rope = TorchRope | FlashInferRope


@dataclass(frozen=True)
class FusedOps:
    """The decoder's elementwise ops, each torch's or FlashInfer's (the field names are :data:`OPS`).

    ``fused_add_rmsnorm``: None runs torch's add, then :func:`rms_norm`. ``flashinfer``: the ops that run
    FlashInfer's kernels."""

    fused_add_rmsnorm: AddRmsNorm | None
    silu_and_mul: SiluAndMul
    rope: Rope
    flashinfer: tuple[str, ...] = ()

    def add_rms_norm(self, delta: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(residual + delta), residual + delta)``; ``delta`` None: ``residual`` as it is.

        The fused kernel writes both results over ``delta`` and ``residual``: pass only this step's own
        tensors (a projection's output, the embedding), never a weight or a caller's tensor."""
        if delta is None:
            return rms_norm(residual, weight, eps), residual
        if self.fused_add_rmsnorm is None:
            residual = residual + delta
            return rms_norm(residual, weight, eps), residual
        self.fused_add_rmsnorm(delta, residual, weight, eps)
        return delta, residual

    def final_rms_norm(self, delta: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       rows: torch.Tensor) -> torch.Tensor:
        """``rms_norm((residual + delta)[rows])``: torch adds every row and normalises the selected ones;
        the fused kernel does both for every row in one launch, then selects."""
        if delta is not None and self.fused_add_rmsnorm is not None:
            self.fused_add_rmsnorm(delta, residual, weight, eps)
            return delta[rows]
        hidden = residual if delta is None else residual + delta
        return rms_norm(hidden[rows], weight, eps)


OPS = ("fused_add_rmsnorm", "silu_and_mul", "rope")


def torch_ops(rope: RotaryEmbedding, dtype: torch.dtype) -> FusedOps:
    return FusedOps(None, torch_silu_and_mul, TorchRope(rope, dtype))


def _flashinfer_silu_and_mul(module: ModuleType) -> SiluAndMul:
    kernel = module.silu_and_mul
    return lambda gate_up: kernel(gate_up.contiguous())


FLASHINFER_OPS: dict[str, Callable[[ModuleType, RotaryEmbedding, torch.device], Any]] = {
    "fused_add_rmsnorm": lambda module, rope, device: module.fused_add_rmsnorm,
    "silu_and_mul": lambda module, rope, device: _flashinfer_silu_and_mul(module),
    "rope": lambda module, rope, device: FlashInferRope(module.apply_rope_with_cos_sin_cache_inplace, rope, device),
}
"""Per op of :data:`OPS`, how its FlashInfer form is built from a ``flashinfer`` module (a missing symbol
raises here, and the op stays torch's)."""

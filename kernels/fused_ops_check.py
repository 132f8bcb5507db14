"""The load-time check of FlashInfer's fused ops (:mod:`kernels.fused_ops`): each runs once on random input of
the model's own shapes, laid out as the decoder lays it out, against the torch op. An op that raises (its JIT
build fails, a symbol is missing, a shape is refused) or disagrees beyond :data:`TOLERANCE` stays torch's:
a broken kernel costs speed, never tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import torch

from kernels.fused_ops import FLASHINFER_OPS, OPS, FusedOps, Rope, torch_ops, torch_silu_and_mul
from kernels.norm import rms_norm
from kernels.rope import RotaryEmbedding

TOLERANCE = 2**-5
"""Elementwise ``|fused - torch| <= TOLERANCE * (1 + |torch|)``, inputs uniform in [-1, 1]: 8 bf16 steps at 1.
The kernels round differently from torch (float32 rope tables and sums, the norm of the unrounded residual
sum): up to ~0.006 in bf16 at Llama-8B shapes on the CPU stand-in, whose arithmetic is theirs. A kernel with
the wrong layout or semantics is off by O(1)."""
ROWS = 7


@dataclass(frozen=True)
class CheckShapes:
    """The model's shapes the ops run at (``intermediates``: each MLP width, the experts' included)."""

    hidden: int
    intermediates: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float


@dataclass(frozen=True)
class Inputs:
    """What a check draws its random input from."""

    shapes: CheckShapes
    rope: RotaryEmbedding
    device: torch.device
    dtype: torch.dtype
    gen: torch.Generator
    rows: int

    def uniform(self, *size: int) -> torch.Tensor:
        """Uniform in [-1, 1] (see :data:`TOLERANCE`)."""
        return (torch.rand(*size, generator=self.gen, device=self.device) * 2 - 1).to(self.dtype)


def choose(module: ModuleType, rope: RotaryEmbedding, shapes: CheckShapes, device: torch.device,
           dtype: torch.dtype, rows: int = ROWS) -> tuple[FusedOps, dict[str, str]]:
    """The ops with FlashInfer's kernel wherever it builds from ``module`` and agrees with torch on ``rows``
    tokens, and for each other op why it stays torch's."""
    ops, failed = torch_ops(rope, dtype), {}
    for name in OPS:
        gen = torch.Generator(device=device).manual_seed(0)
        try:
            candidate = FLASHINFER_OPS[name](module, rope, device)
            why = CHECKS[name](candidate, Inputs(shapes, rope, device, dtype, gen, rows))
        except Exception as exc:  # whatever an optional kernel raises at load: torch's op, and the reason logged
            why = f"raised {type(exc).__name__}: {str(exc)[:300]}"
        if why:
            failed[name] = why
        else:
            ops = replace(ops, **{name: candidate}, flashinfer=(*ops.flashinfer, name))
    return ops, failed


def _differs(what: str, got: torch.Tensor, want: torch.Tensor) -> str:
    """Why ``got`` is not ``want`` within :data:`TOLERANCE` ("" when it is)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: {got.dtype} {list(got.shape)}, torch's is {want.dtype} {list(want.shape)}"
    error = (got.float() - want.float()).abs()
    if not bool((error <= TOLERANCE * (1 + want.float().abs())).all()):  # NaN fails too
        return f"{what} differs from torch's by up to {error.max().item():.4g}"
    return ""


def _check_add_rmsnorm(kernel: Callable[..., None], given: Inputs) -> str:
    hidden, eps = given.shapes.hidden, given.shapes.eps
    delta, residual = given.uniform(given.rows, hidden), given.uniform(given.rows, hidden)
    weight = 1 + given.uniform(hidden) / 4
    want_residual = residual + delta
    want = rms_norm(want_residual, weight, eps)
    kernel(delta, residual, weight, eps)
    return _differs("the normalised sum", delta, want) or _differs("the residual sum", residual, want_residual)


def _check_silu_and_mul(op: Callable[[torch.Tensor], torch.Tensor], given: Inputs) -> str:
    for width in given.shapes.intermediates:
        gate_up = given.uniform(given.rows, 2 * width)
        if why := _differs(f"width {width}", op(gate_up), torch_silu_and_mul(gate_up)):
            return why
    return ""


def _check_rope(op: Rope, given: Inputs) -> str:
    """On views of one qkv row block, as the decoder passes them (rows strided past v); v must stay as it is.
    The reference gathers its rows of the rope's float32 tables (``TorchRope`` would keep a device copy of
    the whole tables in the model dtype, which a model on the fused rope never reads)."""
    heads, kv_heads, dim, rows = given.shapes.num_heads, given.shapes.num_kv_heads, given.shapes.head_dim, given.rows
    qkv = given.uniform(rows, (heads + 2 * kv_heads) * dim)
    positions = torch.randint(0, given.rope.max_position, (rows,), generator=given.gen, device=given.device)
    v_before = qkv[:, (heads + kv_heads) * dim:].clone()
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(rows, heads, dim), k.view(rows, kv_heads, dim)
    cos, sin = (table[positions.cpu()].to(given.device, given.dtype).unsqueeze(1)
                for table in (given.rope.cos, given.rope.sin))
    want_q, want_k = given.rope.rotate(q, cos, sin), given.rope.rotate(k, cos, sin)
    got_q, got_k = op(q, k, op.prepare(positions))
    return (_differs("q", got_q, want_q) or _differs("k", got_k, want_k)
            or ("" if torch.equal(v, v_before) else "it wrote into v"))


CHECKS: dict[str, Callable[[Any, Inputs], str]] = {
    "fused_add_rmsnorm": _check_add_rmsnorm, "silu_and_mul": _check_silu_and_mul, "rope": _check_rope}

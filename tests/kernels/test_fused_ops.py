"""The fused ops' plumbing on the CPU over the torch stand-in for flashinfer: FlashInfer's forms give torch's
numbers within bf16 rounding (in place where FlashInfer's kernels are, on the decoder's strided views, with
rope scaling carried over), and the load check keeps torch's op wherever a kernel raises, is missing or is
wrong. The real kernels: ``test_fused_ops_gpu.py``."""

from __future__ import annotations

import re
import types

import fake_flashinfer
import pytest
import torch

from kernels.fused_ops import OPS, FlashInferRope, TorchRope, cos_sin_cache, torch_ops
from kernels.fused_ops_check import TOLERANCE, CheckShapes, choose
from kernels.norm import rms_norm
from kernels.rope import RotaryEmbedding
from kernels.rope_scaling import RopeScaling

CPU = torch.device("cpu")
SHAPES = CheckShapes(hidden=64, intermediates=(96, 40), num_heads=4, num_kv_heads=2, head_dim=16, eps=1e-5)
SCALINGS = {
    "default": None,
    "llama3": RopeScaling("llama3", factor=8.0, original_max_position=64),
    "yarn": RopeScaling("yarn", factor=4.0, original_max_position=128),  # attention factor != 1
}


def stand_in(**overrides) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{**vars(fake_flashinfer), **overrides})


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=TOLERANCE, atol=TOLERANCE)


def fused(rope: RotaryEmbedding, dtype: torch.dtype = torch.bfloat16):
    ops, failed = choose(stand_in(), rope, SHAPES, CPU, dtype)
    assert failed == {} and ops.flashinfer == OPS
    return ops


def test_cos_sin_cache_is_cos_then_sin_from_the_rope_tables() -> None:
    rope = RotaryEmbedding(16, 256, 10000.0, scaling=SCALINGS["yarn"])
    cache = cos_sin_cache(rope)
    assert cache.dtype == torch.float32 and cache.shape == (256, 16) and cache.is_contiguous()
    assert torch.equal(cache[:, :8], rope.cos[:, 8:]) and torch.equal(cache[:, 8:], rope.sin[:, 8:])
    assert rope.sin[5, 9] > 0 and torch.equal(rope.sin[:, :8], -rope.sin[:, 8:])  # [-sin | sin]: sin kept


def test_add_rms_norm_writes_the_sum_and_its_norm_in_place() -> None:
    rope = RotaryEmbedding(16, 64, 10000.0)
    gen = torch.Generator().manual_seed(1)
    delta, residual = (torch.randn(5, 64, generator=gen).bfloat16() for _ in range(2))
    weight = (1 + torch.randn(64, generator=gen) / 4).bfloat16()
    want, want_residual = torch_ops(rope, torch.bfloat16).add_rms_norm(delta, residual, weight, 1e-5)
    assert torch.equal(want_residual, residual + delta) and torch.equal(want, rms_norm(residual + delta, weight, 1e-5))
    d, r = delta.clone(), residual.clone()
    got, got_residual = fused(rope).add_rms_norm(d, r, weight, 1e-5)
    assert got is d and got_residual is r  # in place
    close(got, want)
    close(got_residual, want_residual)
    first, same = fused(rope).add_rms_norm(None, residual, weight, 1e-5)  # the first layer: no sum yet
    assert same is residual and torch.equal(first, rms_norm(residual, weight, 1e-5))


def test_final_rms_norm_normalises_the_selected_rows_of_the_sum() -> None:
    rope = RotaryEmbedding(16, 64, 10000.0)
    gen = torch.Generator().manual_seed(2)
    delta, residual = (torch.randn(6, 64, generator=gen).bfloat16() for _ in range(2))
    weight, rows = torch.ones(64, dtype=torch.bfloat16), torch.tensor([5, 0, 3])
    want = rms_norm((residual + delta)[rows], weight, 1e-5)
    assert torch.equal(torch_ops(rope, torch.bfloat16).final_rms_norm(delta, residual, weight, 1e-5, rows), want)
    close(fused(rope).final_rms_norm(delta.clone(), residual.clone(), weight, 1e-5, rows), want)
    assert torch.equal(fused(rope).final_rms_norm(None, residual, weight, 1e-5, rows),
                       rms_norm(residual[rows], weight, 1e-5))


def test_silu_and_mul_matches_torch_on_a_strided_input() -> None:
    rope = RotaryEmbedding(16, 64, 10000.0)
    gate_up = torch.randn(7, 200, generator=torch.Generator().manual_seed(3)).bfloat16()[:, :192]  # not contiguous
    want = torch_ops(rope, torch.bfloat16).silu_and_mul(gate_up)
    close(fused(rope).silu_and_mul(gate_up), want)


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
def test_rope_rotates_the_qkv_views_in_place_and_leaves_v(scaling: str) -> None:
    rope = RotaryEmbedding(16, 512, 10000.0, scaling=SCALINGS[scaling])
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(9, (4 + 2 * 2) * 16, generator=gen).bfloat16()
    v_before = qkv[:, 96:].clone()
    q, k, v = qkv.split([64, 32, 32], dim=-1)
    q, k = q.view(9, 4, 16), k.view(9, 2, 16)
    positions = torch.randint(0, 512, (9,), generator=gen)
    reference = TorchRope(rope, torch.bfloat16)
    want_q, want_k = reference(q, k, reference.prepare(positions))
    op = fused(rope).rope
    assert isinstance(op, FlashInferRope)
    got_q, got_k = op(q, k, op.prepare(positions))
    assert got_q is q and got_k is k and got_q.data_ptr() == qkv.data_ptr()  # rotated where they are
    close(got_q, want_q)
    close(got_k, want_k)
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("rotary_dim", [None, 8], ids=["whole", "partial"])
def test_interleaved_rope_fuses_as_gpt_j_pairs(rotary_dim: int | None) -> None:
    """GLM-4's interleaved pairs: FlashInfer's kernel without ``is_neox`` over the same angle table gives torch's
    rotation, partial rotary dims included."""
    rope = RotaryEmbedding(16, 128, 10000.0, rotary_dim=rotary_dim, interleaved=True)
    cos, sin = rope.frequency_tables()
    assert torch.equal(cos_sin_cache(rope), torch.cat((cos, sin), dim=-1))
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(6, 4, 16, generator=gen).bfloat16(), torch.randn(6, 2, 16, generator=gen).bfloat16()
    positions = torch.randint(0, 128, (6,), generator=gen)
    reference = TorchRope(rope, torch.bfloat16)
    want_q, want_k = reference(q, k, reference.prepare(positions))
    op = fused(rope).rope
    assert isinstance(op, FlashInferRope) and not op.is_neox
    got_q, got_k = op(q.clone(), k.clone(), op.prepare(positions))
    close(got_q, want_q)
    close(got_k, want_k)


def test_float16_passes_the_check_too() -> None:
    assert fused(RotaryEmbedding(16, 64, 10000.0), torch.float16).flashinfer == OPS


def _raises(*args, **kwargs):
    raise RuntimeError("ninja: build stopped: subcommand failed")


def _off_by_one(input, residual, weight, eps=1e-6, enable_pdl=None):
    fake_flashinfer.fused_add_rmsnorm(input, residual, weight, eps)
    input.add_(1)


def _cos_for_sin(positions, query, key, head_size, cos_sin_cache, is_neox=True):  # a table of the wrong layout
    cos = cos_sin_cache[:, :cos_sin_cache.shape[1] // 2]
    fake_flashinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size,
                                                          torch.cat((cos, cos), dim=-1))


@pytest.mark.parametrize(("overrides", "broken", "why"), [
    ({"fused_add_rmsnorm": _raises}, "fused_add_rmsnorm", "raised RuntimeError: ninja: build stopped"),
    ({"silu_and_mul": lambda input: torch.zeros_like(input)}, "silu_and_mul", "width 96: torch.bfloat16 \\[7, 192\\]"),
    ({"silu_and_mul": lambda input: input[..., :input.shape[-1] // 2] * 0}, "silu_and_mul", "differs from torch's"),
    ({"fused_add_rmsnorm": _off_by_one}, "fused_add_rmsnorm", "normalised sum differs from torch's by up to"),
    ({"apply_rope_with_cos_sin_cache_inplace": _cos_for_sin}, "rope", "q differs from torch's"),
    ({"apply_rope_with_cos_sin_cache_inplace": None}, "rope", "raised TypeError"),
])
def test_a_kernel_that_raises_or_is_wrong_stays_torch(overrides, broken: str, why: str) -> None:
    rope = RotaryEmbedding(16, 64, 10000.0)
    ops, failed = choose(stand_in(**overrides), rope, SHAPES, CPU, torch.bfloat16)
    assert list(failed) == [broken] and re.search(why, failed[broken]), failed
    assert ops.flashinfer == tuple(name for name in OPS if name != broken)
    if broken == "fused_add_rmsnorm":
        assert ops.fused_add_rmsnorm is None
    elif broken == "rope":
        assert isinstance(ops.rope, TorchRope)
    else:
        assert ops.silu_and_mul is torch_ops(rope, torch.bfloat16).silu_and_mul


def test_a_missing_symbol_stays_torch() -> None:
    module = stand_in()
    del module.silu_and_mul
    ops, failed = choose(module, RotaryEmbedding(16, 64, 10000.0), SHAPES, CPU, torch.bfloat16)
    assert list(failed) == ["silu_and_mul"] and failed["silu_and_mul"].startswith("raised AttributeError")
    assert ops.flashinfer == ("fused_add_rmsnorm", "rope")


def test_a_rope_that_writes_past_k_stays_torch() -> None:
    def spills(positions, query, key, head_size, cos_sin_cache, is_neox=True):
        fake_flashinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache)
        key.as_strided((key.shape[0], 1), (key.stride(0), 1), key.storage_offset() + key.shape[1]).fill_(0)

    ops, failed = choose(stand_in(apply_rope_with_cos_sin_cache_inplace=spills), RotaryEmbedding(16, 64, 10000.0),
                         SHAPES, CPU, torch.bfloat16)
    assert failed == {"rope": "it wrote into v"} and isinstance(ops.rope, TorchRope)

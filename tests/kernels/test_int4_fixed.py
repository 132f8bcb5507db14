"""The deterministic mode's 4-bit projection (kernels/int4_fixed.py): as accurate as torch's 4-bit kernel, a
row's bits independent of the row count, of its place and of the other rows, and the same on the AVX path
and the AMX tiles (which add in an undocumented order: the kernel's sums are exact so that none matters)."""

from __future__ import annotations

import pytest
import torch

from kernels.amx_linear import amx_supported
from kernels.int4_fixed import int4_fixed_linear, int4_fixed_supported, pack_int4_fixed
from kernels.int4_linear import GroupQuantized

pytestmark = pytest.mark.skipif(not int4_fixed_supported(), reason="no AVX512-BF16/VNNI here")

SHAPES = [(960, 576), (3072, 576), (576, 1536), (48, 64), (16, 32)]


def _weight(out_features: int, in_features: int, seed: int = 0) -> GroupQuantized:
    """Codes, scales and offsets as a Q4_1 file holds them (fp16 scale and offset per 32 inputs)."""
    generator = torch.Generator().manual_seed(seed)
    groups = (out_features, in_features // 32)
    return GroupQuantized(torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8, generator=generator),
                          (torch.rand(groups, generator=generator) * 0.01).half().float(),
                          (-torch.rand(groups, generator=generator) * 0.08).half().float(), 32)


def _inputs(rows: int, in_features: int, kind: str, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator)
    if kind == "wide":  # eight decades within a row: the partial sums' exponents far apart
        x = x * 10 ** (torch.rand(rows, in_features, generator=generator) * 8 - 4)
    elif kind == "huge":
        x = x * 1e25
    elif kind == "tiny":
        x = x * 1e-25
    return x.bfloat16()


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_matches_a_float64_product_within_bf16_rounding(out_features, in_features):
    weight = _weight(out_features, in_features)
    bias = torch.randn(out_features).bfloat16()
    x = _inputs(40, in_features, "plain")
    exact = x.double() @ weight.dequantize().double().T + bias.double()
    for avx_max_rows in (0, 1000):  # the tiles, then AVX for every row
        out = int4_fixed_linear(x, pack_int4_fixed(weight, bias), avx_max_rows)
        assert out.dtype == torch.bfloat16 and out.shape == (40, out_features)
        # one bf16 rounding of the fp32 sum; the grid moves an input by at most 2^-15 of its group's largest
        grid_error = x.double().abs().amax() * weight.dequantize().abs().amax() * in_features * 2**-14
        tolerance = exact.abs() * 2**-8 + grid_error
        assert ((out.double() - exact).abs() <= tolerance + 1e-3).all()


def test_inputs_the_grid_keeps_get_one_fp32_sum_and_one_rounding():
    """Every input within 2^7 of its group's largest is on the grid: the only error left is the fp32 sums'
    and the final bf16 rounding (a coarser grid than the kernel's fails this)."""
    weight = _weight(960, 576)
    generator = torch.Generator().manual_seed(5)
    magnitudes = 2.0 ** -(torch.rand(40, 576, generator=generator) * 6)  # within 2^6 of 1
    signs = torch.randint(0, 2, (40, 576), generator=generator) * 2 - 1
    x = (magnitudes * signs).bfloat16()
    products = x.double()[:, None, :] * weight.dequantize().double()[None]
    exact, scale = products.sum(-1), products.abs().sum(-1)
    for avx_max_rows in (0, 1000):
        out = int4_fixed_linear(x, pack_int4_fixed(weight), avx_max_rows).double()
        assert ((out - exact).abs() <= exact.abs() * 2**-8 + scale * 2**-20).all()


def test_a_nan_or_an_infinity_makes_its_row_nan_on_both_paths_and_leaves_the_others():
    packed = pack_int4_fixed(_weight(80, 96))
    x = _inputs(12, 96, "plain")
    x[2, 19], x[5, 0], x[7, 40], x[9, 31] = float("nan"), float("inf"), float("-inf"), float("nan")
    x[9, :32] = float("nan")
    poisoned = [2, 5, 7, 9]
    for avx_max_rows in (0, 4, 1000):
        out = int4_fixed_linear(x, packed, avx_max_rows)
        assert out[poisoned].isnan().all()
        clean = [i for i in range(12) if i not in poisoned]
        assert torch.equal(out[clean], int4_fixed_linear(x[clean], packed, 1000))


def test_the_thread_count_changes_no_bit():
    packed = pack_int4_fixed(_weight(960, 576))
    x = _inputs(20, 576, "wide")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [int4_fixed_linear(x[:m], packed) for m in (1, 20)]
        torch.set_num_threads(3)
        three = [int4_fixed_linear(x[:m], packed) for m in (1, 20)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, three, strict=True))


@pytest.mark.parametrize("kind", ["plain", "wide", "huge", "tiny"])
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (80, 96)])  # 80: a quad and one block
def test_a_row_gets_its_bits_alone_on_either_path_at_any_row_count(kind, out_features, in_features):
    packed = pack_int4_fixed(_weight(out_features, in_features), torch.randn(out_features).bfloat16())
    x = _inputs(70, in_features, kind)
    alone = torch.cat([int4_fixed_linear(x[i:i + 1], packed) for i in range(70)])
    paths = [1000, 4, 1] + ([0] if amx_supported() else [])  # AVX at any count, switching, the tiles for >= 1 row
    for avx_max_rows in paths:
        for start, end in [(0, 70), (0, 2), (0, 3), (3, 12), (5, 37), (31, 33), (69, 70)]:
            assert torch.equal(int4_fixed_linear(x[start:end], packed, avx_max_rows), alone[start:end]), (
                kind, avx_max_rows, start, end)
    shuffled = torch.randperm(70)
    assert torch.equal(int4_fixed_linear(x[shuffled], packed, 0), alone[shuffled])


def test_a_group_of_zeros_or_of_negative_zeros_gives_the_same_bits_on_both_paths():
    packed = pack_int4_fixed(_weight(64, 64))
    x = _inputs(20, 64, "plain")
    x[::2, :32] = 0.0
    x[1::2, :32] = -0.0
    x[3, 32:] = 1e-35  # a group whose largest input is below 2^-100 counts as zero
    for avx_max_rows in (1000, 0):
        out = int4_fixed_linear(x, packed, avx_max_rows)
        assert torch.equal(out, torch.cat([int4_fixed_linear(x[i:i + 1], packed, 1000) for i in range(20)]))


def test_inputs_it_does_not_take_are_refused():
    assert pack_int4_fixed(GroupQuantized(torch.zeros(40, 64, dtype=torch.uint8), torch.ones(40, 2),
                                          torch.zeros(40, 2), 32)) is None  # out not a multiple of 16
    assert pack_int4_fixed(GroupQuantized(torch.zeros(32, 64, dtype=torch.uint8), torch.ones(32, 4),
                                          torch.zeros(32, 4), 16)) is None  # groups of 16
    packed = pack_int4_fixed(_weight(32, 64))
    assert int4_fixed_linear(torch.empty(0, 64).bfloat16(), packed).shape == (0, 32)
    with pytest.raises(ValueError, match="bf16"):
        int4_fixed_linear(torch.randn(2, 64), packed)
    with pytest.raises(ValueError, match="meta"):
        int4_fixed_linear(torch.randn(2, 64, device="meta").bfloat16(), packed)
    with pytest.raises(ValueError, match="64"):
        int4_fixed_linear(torch.randn(2, 32).bfloat16(), packed)


def test_a_build_without_amx_gives_the_amx_builds_bits(tmp_path, monkeypatch):
    """A CPU with AVX512-BF16/VNNI but no AMX compiles the AVX path only: every row count then runs it, with
    the bits this build's tiles give (so nodes of the two kinds could share KV, were their kernels the same)."""
    from kernels import int4_fixed
    from kernels.attention.native import build

    packed = pack_int4_fixed(_weight(960, 576), torch.randn(960).bfloat16())
    x = _inputs(40, 576, "wide")
    want = int4_fixed_linear(x, packed, 0)
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "FLAGS", (*build.FLAGS, "-mno-amx-tile"))
    build._loaded.clear()
    int4_fixed._kernel.cache_clear()
    try:
        assert torch.equal(int4_fixed_linear(x, packed, 0), want)
    finally:
        build._loaded.clear()
        int4_fixed._kernel.cache_clear()
    assert len(list((tmp_path / "native").glob("*.so"))) == 1

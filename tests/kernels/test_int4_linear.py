"""4-bit group-quantised projections: packing, the kernel's arithmetic, and when ``linear`` uses them."""

from __future__ import annotations

import pytest
import torch

from kernels.int4_linear import GroupQuantized, int4_linear, int4_supported, pack_int4
from kernels.linear import linear, prepare_linear

pytestmark = pytest.mark.skipif(not int4_supported("cpu", torch.bfloat16), reason="no int4 CPU kernel in torch")


def random_q4(out_features: int, in_features: int, seed: int = 0, group: int = 32) -> GroupQuantized:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.uint8)
    scales = torch.rand(out_features, in_features // group, generator=gen) * 0.02
    offsets = -torch.rand(out_features, in_features // group, generator=gen) * 0.15
    return GroupQuantized(codes, scales, offsets, group)


def test_dequantize_is_scale_times_code_plus_offset():
    weight = random_q4(16, 64)
    dense = weight.dequantize()
    assert dense[3, 40] == weight.scales[3, 1] * weight.codes[3, 40].float() + weight.offsets[3, 1]
    assert dense[0, 0] == weight.scales[0, 0] * weight.codes[0, 0].float() + weight.offsets[0, 0]


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_int4_product_matches_the_dequantised_weight(rows):
    weight = random_q4(96, 128, seed=rows)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(7)).bfloat16()
    expected = x.double() @ weight.dequantize().double().T
    got = int4_linear(x, pack_int4(weight))
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    # bf16 scale/zero and a bf16 result: a few parts in a thousand of the output's range
    assert (got.double() - expected).abs().max() <= 1e-2 * expected.abs().max()


def test_cat_and_rows_keep_each_row_with_its_scales():
    a, b = random_q4(8, 64, seed=1), random_q4(16, 64, seed=2)
    fused = GroupQuantized.cat([a, b])
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    order = torch.tensor([3, 0, 7, 1, 2, 6, 5, 4])
    assert torch.equal(a.rows(order).dequantize(), a.dequantize()[order])


def test_linear_uses_the_4bit_form_up_to_int4_max_rows_only():
    """The dense weight is made deliberately different (zero) so the result shows which one ran."""
    weight = random_q4(64, 96, seed=3)
    prepared = prepare_linear(torch.zeros(64, 96, dtype=torch.bfloat16), int4=weight, int4_max_rows=4)
    few, many = torch.ones(4, 96, dtype=torch.bfloat16), torch.ones(5, 96, dtype=torch.bfloat16)
    assert linear(few, prepared).abs().sum() > 0
    assert linear(many, prepared).abs().sum() == 0


def test_int4_off_means_dense_only():
    prepared = prepare_linear(torch.zeros(64, 96, dtype=torch.bfloat16), int4=random_q4(64, 96), int4_max_rows=0)
    assert prepared.int4 is None
    assert linear(torch.ones(1, 96, dtype=torch.bfloat16), prepared).abs().sum() == 0


def test_shape_mismatch_between_dense_and_4bit_is_refused():
    with pytest.raises(AssertionError, match="differs from the dense"):
        prepare_linear(torch.zeros(32, 96, dtype=torch.bfloat16), int4=random_q4(64, 96), int4_max_rows=8)


def test_int4_is_cpu_bf16_only():
    assert not int4_supported("cpu", torch.float32)
    assert not int4_supported("meta", torch.bfloat16)

"""The AMX projection of the deterministic mode's prompt rows (kernels/amx_linear.py): as accurate as a bf16
product, and a row's bits independent of the row count, of where it sits and of the other rows."""

from __future__ import annotations

import pytest
import torch

from kernels.amx_linear import amx_linear, amx_supported, pack_amx

pytestmark = pytest.mark.skipif(not amx_supported(), reason="no AMX here (CPU, compiler or OS)")


@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (3072, 576), (576, 1536), (48, 64), (16, 32)])
def test_matches_a_float64_product_within_bf16_rounding(out_features, in_features):
    torch.manual_seed(0)
    weight = (torch.randn(out_features, in_features) * 0.05).bfloat16()
    bias = torch.randn(out_features).bfloat16()
    x = torch.randn(77, in_features).bfloat16()
    exact = x.double() @ weight.double().T + bias.double()
    out = amx_linear(x, pack_amx(weight, bias))
    assert out.dtype == torch.bfloat16 and out.shape == (77, out_features)
    # one bf16 rounding of an fp32 sum: within 2^-8 of the value (plus fp32 summation error)
    assert ((out.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3).all()
    no_bias = amx_linear(x, pack_amx(weight))
    assert ((no_bias.double() - (exact - bias.double())).abs() <= exact.abs() * 2**-8 + 1e-2).all()


def test_a_row_gets_its_bits_alone_at_any_row_count_and_place():
    torch.manual_seed(1)
    weight = pack_amx((torch.randn(960, 576) * 0.05).bfloat16(), torch.randn(960).bfloat16())
    x = torch.randn(300, 576).bfloat16()
    alone = torch.cat([amx_linear(x[i:i + 1], weight) for i in range(300)])
    for start, end in [(0, 300), (0, 32), (0, 33), (5, 37), (31, 33), (100, 228), (299, 300)]:
        assert torch.equal(amx_linear(x[start:end], weight), alone[start:end]), (start, end)
    shuffled = torch.randperm(300)
    assert torch.equal(amx_linear(x[shuffled], weight), alone[shuffled])


def test_shapes_and_dtypes_it_does_not_serve_get_no_packing():
    assert pack_amx(torch.randn(64, 48).bfloat16()) is None  # in not a multiple of 32
    assert pack_amx(torch.randn(40, 64).bfloat16()) is None  # out not a multiple of 16
    assert pack_amx(torch.randn(64, 64)) is None  # float32
    assert amx_linear(torch.empty(0, 64).bfloat16(), pack_amx(torch.randn(32, 64).bfloat16())).shape == (0, 32)

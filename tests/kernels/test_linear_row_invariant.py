"""The row invariance the deterministic mode relies on (kernels/linear.py): on this machine, a row's
product is the same bits at any row count through the 4-bit kernel, and through a dense weight in blocks
of ``INVARIANT_ROW_BLOCK`` rows; the default switch between the two paths is what changes a row."""

from __future__ import annotations

import pytest
import torch

from kernels.int4_linear import GroupQuantized, int4_supported
from kernels.linear import INT4_ALL_ROWS, INVARIANT_ROW_BLOCK, linear, prepare_linear

pytestmark = pytest.mark.skipif(not int4_supported("cpu", torch.bfloat16), reason="no int4 CPU kernel")


def _weight(out_features=256, in_features=512, group=32):
    torch.manual_seed(0)
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8)
    scales = torch.rand(out_features, in_features // group) * 0.02
    offsets = -8 * scales
    quantized = GroupQuantized(codes, scales, offsets, group)
    return quantized, quantized.dequantize().bfloat16()


@pytest.mark.parametrize("mode", ["int4_all_rows", "dense_blocked"])
def test_a_row_gets_the_same_bits_at_any_row_count(mode):
    quantized, dense = _weight()
    weight = (prepare_linear(dense, int4=quantized, int4_max_rows=INT4_ALL_ROWS) if mode == "int4_all_rows"
              else prepare_linear(dense, row_block=INVARIANT_ROW_BLOCK))
    x = torch.randn(200, 512).bfloat16()
    alone = torch.cat([linear(x[i:i + 1], weight) for i in range(x.shape[0])])
    for rows in (2, 7, 8, 9, 16, 31, 32, 33, 64, 100, 200):
        assert torch.equal(linear(x[:rows], weight), alone[:rows]), rows


def test_the_default_path_switch_is_what_changes_a_row():
    quantized, dense = _weight()
    weight = prepare_linear(dense, int4=quantized, int4_max_rows=8)
    x = torch.randn(9, 512).bfloat16()
    assert not torch.equal(linear(x[:8], weight)[0], linear(x, weight)[0])

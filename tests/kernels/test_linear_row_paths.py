"""Per-row paths of the deterministic mode (``RowPaths``, kernels/linear.py): in a step that mixes prompt rows
(dense, in padded blocks of ``PROMPT_ROW_BLOCK``) and output rows (4-bit), each row gets the bits it gets
alone on its own path, at every row count, mix and chunk start; a step of one kind gathers nothing."""

from __future__ import annotations

import random

import pytest
import torch

from kernels.amx_linear import amx_supported
from kernels.int4_linear import GroupQuantized, int4_supported
from kernels.linear import INT4_ALL_ROWS, INVARIANT_ROW_BLOCK, RowPaths, linear, prepare_linear

pytestmark = pytest.mark.skipif(not int4_supported("cpu", torch.bfloat16), reason="no int4 CPU kernel")


@pytest.fixture(scope="module", params=["amx_where_there", "padded_blocks"])
def weight(request):
    """The prompt path as this CPU runs it (AMX where it has it), and oneDNN's padded blocks (the path of a CPU
    without AMX) forced."""
    torch.manual_seed(0)
    out_features, in_features, group = 192, 256, 32
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8)
    scales = torch.rand(out_features, in_features // group) * 0.02
    quantized = GroupQuantized(codes, scales, -8 * scales, group)
    bias = torch.randn(out_features).bfloat16()
    amx_wanted = request.param == "amx_where_there"  # else a weight packed without AMX: it keeps its dense form
    prepared = prepare_linear(quantized.dequantize().bfloat16(), int4=quantized, int4_max_rows=INT4_ALL_ROWS,
                              bias=bias, row_block=INVARIANT_ROW_BLOCK, prompt_rows=amx_wanted)
    assert (prepared.amx is not None) == (amx_wanted and amx_supported())
    assert (prepared.weight.numel() == 0) == (prepared.amx is not None)  # no row reads a dense copy: none kept
    return prepared


@pytest.fixture(scope="module")
def rows_alone(weight):
    """Each of 70 rows alone: on the dense path and on the 4-bit path."""
    x = torch.randn(70, 256).bfloat16()
    dense = torch.cat([linear(x[i:i + 1], weight, RowPaths.of([True])) for i in range(70)])
    int4 = torch.cat([linear(x[i:i + 1], weight, RowPaths.of([False])) for i in range(70)])
    return x, dense, int4


def test_the_two_paths_give_a_row_different_bits(rows_alone):
    _, dense, int4 = rows_alone
    assert not torch.equal(dense, int4)  # so the test below sees a row on the wrong path


def test_each_row_gets_its_bits_alone_on_its_own_path_at_any_mix(weight, rows_alone):
    x, dense, int4 = rows_alone
    rng = random.Random(0)
    for rows in range(1, 71):
        for mix in ("random", "prompt_then_output", "all_prompt", "all_output"):
            if mix == "random":
                mask = [rng.random() < 0.5 for _ in range(rows)]
            elif mix == "prompt_then_output":
                mask = [i < rng.randrange(rows + 1) for i in range(rows)]
            else:
                mask = [mix == "all_prompt"] * rows
            paths = RowPaths.of(mask)
            expected = torch.where(torch.tensor(mask)[:, None], dense[:rows], int4[:rows])
            assert torch.equal(linear(x[:rows], weight, paths), expected), (rows, mix, mask)


def test_a_step_of_one_kind_builds_no_index():
    assert not RowPaths.of([True] * 5).mixed and not RowPaths.of([False] * 5).mixed
    assert RowPaths.of([True, False]).mixed


@pytest.mark.parametrize("amx", [True, False], ids=["amx_where_there", "padded_blocks"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prompt_rows_get_their_bits_alone_at_any_chunk_start_and_length(dtype, amx):
    """The prompt path: a row's bits do not depend on where its chunk starts (a prefix hit), how long the
    chunk is (past one padded block too) or what else it holds."""
    torch.manual_seed(1)
    weight = prepare_linear((torch.randn(960, 576) * 0.05).to(dtype), row_block=INVARIANT_ROW_BLOCK,
                            prompt_rows=amx)  # without the AMX form: padded oneDNN blocks
    x = torch.randn(300, 576).to(dtype)
    alone = torch.cat([linear(x[i:i + 1], weight, RowPaths.of([True])) for i in range(300)])
    for start, rows in [(0, 300), (0, 128), (0, 129), (1, 127), (17, 200), (100, 33), (255, 45), (299, 1)]:
        chunk = linear(x[start:start + rows], weight, RowPaths.of([True] * rows))
        assert torch.equal(chunk, alone[start:start + rows]), (start, rows)


@pytest.mark.parametrize("amx", [True, False], ids=["amx_where_there", "onednn_blocks"])
def test_a_weight_without_4_bits_runs_output_rows_dense_each_with_its_bits_alone(amx):
    dense_only = prepare_linear(torch.randn(64, 128).bfloat16(), row_block=INVARIANT_ROW_BLOCK, prompt_rows=amx)
    x = torch.randn(40, 128).bfloat16()
    mask = [i % 3 == 0 for i in range(40)]
    prompt_alone = torch.cat([linear(x[i:i + 1], dense_only, RowPaths.of([True])) for i in range(40)])
    output_alone = torch.cat([linear(x[i:i + 1], dense_only, RowPaths.of([False])) for i in range(40)])
    expected = torch.where(torch.tensor(mask)[:, None], prompt_alone, output_alone)
    assert torch.equal(linear(x, dense_only, RowPaths.of(mask)), expected)
    assert torch.equal(linear(x, dense_only), output_alone)  # without paths (the LM head): as output rows
    if dense_only.amx is not None:  # one kernel for both kinds, and no dense copy kept
        assert torch.equal(prompt_alone, output_alone) and dense_only.weight.numel() == 0

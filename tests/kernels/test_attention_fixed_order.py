"""The deterministic mode's attention (``cpu_fixed_order``): prompt rows through the C prompt kernel, output
rows through the C decode kernel. Against the float64 oracle on garbage-filled caches (NaN, +-1e30 in every
slot no row may read), and row invariance: a row's bits do not depend on where its chunk starts, how long
it is, or what else shares the step; for the builds other CPUs compile too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from paged_attention_oracle import TOLERANCE, check_forward_contract, make_sequences, oracle

from kernels.attention.fixed_order import FixedOrderCpuAttention
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.native import build

try:
    build.load_library()
except build.NativeBuildError as exc:
    pytest.skip(f"native attention kernels unavailable here: {exc}", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16]


def _forward(seqs, query_lens, seq_lens, prompt_lens, heads, seed=1, q=None):
    meta, fresh_q, k, v = seqs.step(query_lens, seq_lens, heads, seed)
    meta = AttentionMetadata.build(query_lens, seq_lens, seqs.tables, seqs.block_size, "cpu", prompt_lens)
    backend = FixedOrderCpuAttention("cpu")
    backend.plan(meta)
    q = fresh_q if q is None else q
    return q, backend.forward(q, k, v, seqs.cache, seqs.keys[0].shape[-1] ** -0.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "head_dim", "block_size"),
                         [((9, 3), 64, 16), ((8, 2), 128, 16), ((4, 4), 64, 8), ((9, 3), 16, 16), ((6, 3), 96, 32)])
def test_prompt_and_output_rows_match_the_oracle(dtype, heads, head_dim, block_size):
    """A step of chunked prompts after prefix hits, a prompt's last rows with its first output rows (a
    recompute), and decode rows; masked slots hold NaN and +-1e30."""
    num_heads, num_kv_heads = heads
    seq_lens, query_lens, prompt_lens = [70, 40, 33, 5, 90], [37, 40, 8, 1, 1], [70, 40, 30, 4, 3]
    context = [s - q for q, s in zip(query_lens, seq_lens, strict=True)]
    seqs = make_sequences(seq_lens, context, num_kv_heads, head_dim, block_size, dtype, seed=3)
    q, out = _forward(seqs, query_lens, seq_lens, prompt_lens, num_heads)
    assert out.shape == q.shape and out.dtype == dtype
    expected = oracle(q, seqs, query_lens, seq_lens, head_dim**-0.5)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)


def _only_first(seqs):
    return type(seqs)(seqs.keys[:1], seqs.values[:1], seqs.tables[:1], seqs.cache, seqs.block_size)


def _rows_of_one_prompt(dtype, head_dim=64, heads=(9, 3), length=300, block_size=16):
    """A prompt (and another of 50 tokens) whose whole K/V is in the cache, and each of its rows computed
    alone: a step of that one row."""
    seqs = make_sequences([length, 50], [length, 50], heads[1], head_dim, block_size, dtype, seed=5)
    q = torch.randn(length, heads[0], head_dim, generator=torch.Generator().manual_seed(9)).to(dtype)
    alone = torch.cat([_forward(_only_first(seqs), [1], [p + 1], [length], heads[0], q=q[p:p + 1])[1]
                       for p in range(length)])
    return seqs, q, alone


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prompt_row_gets_its_bits_alone_in_any_chunk_and_step(dtype):
    seqs, q, alone = _rows_of_one_prompt(dtype)
    other = torch.randn(50, 9, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    for start, end in [(0, 300), (0, 17), (16, 48), (37, 300), (100, 101), (255, 300), (290, 300)]:
        chunk = end - start
        _, out = _forward(_only_first(seqs), [chunk], [end], [300], 9, q=q[start:end])
        assert torch.equal(out, alone[start:end]), (start, end)
        # beside another prompt's chunk and a decode row of it, in both orders
        for order in (0, 1):
            parts = [(chunk, end, q[start:end]), (20, 45, other[25:45])]
            parts = parts if order == 0 else parts[::-1]
            tables = [seqs.tables[0], seqs.tables[1]] if order == 0 else [seqs.tables[1], seqs.tables[0]]
            both = type(seqs)([seqs.keys[i] for i in ((0, 1) if order == 0 else (1, 0))],
                              [seqs.values[i] for i in ((0, 1) if order == 0 else (1, 0))], tables, seqs.cache,
                              seqs.block_size)
            _, out = _forward(both, [p[0] for p in parts], [p[1] for p in parts],
                              [300, 50] if order == 0 else [50, 300], 9, q=torch.cat([p[2] for p in parts]))
            mine = out[:chunk] if order == 0 else out[20:]
            assert torch.equal(mine, alone[start:end]), (start, end, order)


def test_an_output_row_gets_its_bits_alone_beside_prompt_rows():
    """Output positions (past prompt_lens) run the decode kernel, as they do alone, in a step of prompt rows."""
    seqs, q, _ = _rows_of_one_prompt(torch.bfloat16, length=120)
    seqs_one = _only_first(seqs)
    alone = torch.cat([_forward(seqs_one, [1], [p + 1], [60], 9, q=q[p:p + 1])[1] for p in range(60, 120)])
    _, recomputed = _forward(seqs_one, [120], [120], [60], 9, q=q)  # a recompute: prompt and outputs in one chunk
    assert torch.equal(recomputed[60:], alone)
    _, chunk = _forward(seqs_one, [30], [90], [60], 9, q=q[60:90])
    assert torch.equal(chunk, alone[:30])


def test_forward_contract_and_refusals():
    backend = FixedOrderCpuAttention("cpu")
    seqs, q, k, v = check_forward_contract(backend, torch.bfloat16, 64, 16)
    with pytest.raises(ValueError, match="cannot serve"):
        backend.forward(q.half(), k.half(), v.half(), seqs.cache.half(), 0.25)
    with pytest.raises(ValueError, match="uses block"):
        backend.forward(q, k, v, seqs.cache[:1], 0.25)


@pytest.mark.parametrize("extra_flags", [("-mno-avx512f", "-mno-amx-tile"), ("-mno-avx512bf16", "-mno-amx-tile"),
                                         ("-mno-amx-tile",)], ids=["portable", "no-bf16-dot", "no-amx"])
def test_other_builds_of_the_kernels(extra_flags, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The loops a CPU without AVX-512, without AVX512-BF16 or without AMX compiles: accurate, and
    row-invariant."""
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "FLAGS", build.FLAGS + extra_flags)
    build._loaded.clear()
    try:
        for dtype in DTYPES:
            test_prompt_and_output_rows_match_the_oracle(dtype, (9, 3), 64, 16)
            seqs, q, alone = _rows_of_one_prompt(dtype, length=70)
            seqs_one = _only_first(seqs)
            for start, end in [(0, 70), (13, 50)]:
                _, out = _forward(seqs_one, [end - start], [end], [70], 9, q=q[start:end])
                assert torch.equal(out, alone[start:end]), (dtype, start, end)
    finally:
        build._loaded.clear()
    assert len(list((tmp_path / "native").glob("*.so"))) == 1

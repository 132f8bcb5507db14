"""Sliding-window attention (Gemma 3's local layers) in the pure-torch backend, against the dense float64
oracle with transformers' window (query position p sees p - W + 1..p): prefill from scratch and after a cached
prefix, decode groups of mixed lengths through both decode implementations, and a mixed step; windows below,
at and past the sequences' lengths. Backends without windows say so (``supports_window``)."""

from __future__ import annotations

import pytest
import torch
from paged_attention_oracle import TOLERANCE, make_sequences, oracle

from kernels.attention import TorchPagedAttention
from kernels.attention.registry import BackendUnavailableError, create_backend

HEAD_DIM, BLOCK_SIZE, HEADS = 16, 4, (8, 2)


def run_windowed(query_lens: list[int], seq_lens: list[int], window: int, dtype: torch.dtype,
                 decode_impl: str = "auto", seed: int = 0) -> None:
    num_heads, num_kv_heads = HEADS
    context = [s - q for q, s in zip(query_lens, seq_lens, strict=True)]
    seqs = make_sequences(seq_lens, context, num_kv_heads, HEAD_DIM, BLOCK_SIZE, dtype, seed)
    meta, q, k, v = seqs.step(query_lens, seq_lens, num_heads, seed + 1)
    backend = TorchPagedAttention("cpu", decode_impl=decode_impl)
    backend.plan(meta)
    scale = HEAD_DIM**-0.5
    full = backend.forward(q, k, v, seqs.cache, scale)
    out = backend.forward(q, k, v, seqs.cache, scale, window=window)  # the same plan serves both kinds of layer
    expected = oracle(q, seqs, query_lens, seq_lens, scale, window=window)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)
    torch.testing.assert_close(full.double(), oracle(q, seqs, query_lens, seq_lens, scale), atol=TOLERANCE[dtype],
                               rtol=0)
    if window < max(seq_lens):  # the window hides something from some query: the two layers differ
        assert not torch.allclose(out, full)
    else:
        assert torch.equal(out, full)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 5, 8, 64])
def test_prefill_from_scratch_and_after_a_prefix(window: int, dtype: torch.dtype) -> None:
    run_windowed([37], [37], window, dtype)
    run_windowed([20], [50], window, dtype, seed=1)
    run_windowed([3, 9], [4, 24], window, dtype, seed=2)


@pytest.mark.parametrize("length", [36, 37])  # the window one short of the sequence, and equal to it
def test_a_window_at_the_length_of_the_sequence(length: int) -> None:
    run_windowed([37], [37], length, torch.float32)  # prefill: only the last query misses position 0 at 36
    run_windowed([1], [37], length, torch.float32, seed=1)
    run_windowed([1, 1], [37, 20], length, torch.float32, seed=2)


@pytest.mark.parametrize("impl", ["sdpa", "bag"])
@pytest.mark.parametrize("window", [1, 6, 13, 64])
def test_decode_groups(impl: str, window: int) -> None:
    run_windowed([1], [29], window, torch.float32, impl)  # one sequence: sdpa slices the window
    run_windowed([1, 1, 1, 1], [3, 29, 17, 40], window, torch.float32, impl, seed=3)


def test_mixed_step_of_prefills_and_decodes() -> None:
    run_windowed([1, 12, 1, 30], [33, 40, 9, 30], 10, torch.float32, seed=4)


def test_backends_declare_whether_they_take_a_window() -> None:
    assert create_backend("torch", "cpu").supports_window
    assert not create_backend("cpu_fixed_order", "cpu").supports_window


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_backend_runs_the_decodes_of_full_and_windowed_layers_in_its_kernel(dtype) -> None:
    """Full and windowed layers alternate over the same step (mixed: decodes and a prefill after a prefix): the
    decode rows of every layer go to the kernel, which reads only each window; the prefill to torch."""
    from kernels.attention.native_cpu import NativeCpuAttention

    try:
        backend = create_backend("cpu_native", "cpu")
    except BackendUnavailableError as exc:  # no compiler here: the kernel's own tests skip too
        pytest.skip(f"cpu_native unavailable: {exc}")
    assert isinstance(backend, NativeCpuAttention) and backend.supports_window
    kernel_calls, kernel = [], backend._decode
    backend._decode = lambda *args: kernel_calls.append(1) or kernel(*args)
    query_lens, seq_lens = [1, 12, 1, 1], [33, 40, 9, 70]
    context = [s - q for q, s in zip(query_lens, seq_lens, strict=True)]
    scale = HEAD_DIM**-0.5
    tables = None
    for layer, window in enumerate([None, 10, None, 10, 3]):
        seqs = make_sequences(seq_lens, context, HEADS[1], HEAD_DIM, BLOCK_SIZE, dtype, seed=layer, tables=tables)
        meta, q, k, v = seqs.step(query_lens, seq_lens, HEADS[0], seed=10 + layer)
        if tables is None:  # one plan for the step: every layer's cache has the same block tables
            tables = seqs.tables
            backend.plan(meta)
        out = backend.forward(q, k, v, seqs.cache, scale, **({} if window is None else {"window": window}))
        expected = oracle(q, seqs, query_lens, seq_lens, scale, window=window)
        torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)
    assert len(kernel_calls) == 5  # every layer's decodes


def test_a_windowed_decode_group_gathers_only_the_blocks_of_its_windows() -> None:
    """A sliding layer's decode reads about its window, not the whole context: at lengths 3 to 4000 and a
    window of 512 in blocks of 16, at most 33 blocks a sequence (full attention gathers 250)."""
    from kernels.attention import AttentionMetadata
    from kernels.attention.torch_plan import build_plan

    lens = [3, 700, 4000, 513]
    tables = [list(range(sum(-(-n // 16) for n in lens[:i]), sum(-(-n // 16) for n in lens[: i + 1])))
              for i in range(len(lens))]
    meta = AttentionMetadata.build([1] * 4, lens, tables, 16, "cpu")
    (group,) = build_plan(meta, group_waste_tokens=10**9).decode_groups
    windowed = group.windowed(512)
    assert group.num_blocks == 250 and windowed.num_blocks == 33
    assert windowed.valid.sum(-1).view(-1).tolist() == [3, 512, 512, 512]
    first_blocks = windowed.block_index.view(4, 33)[:, 0].tolist()
    assert first_blocks == [tables[0][0], tables[1][(700 - 512) // 16], tables[2][(4000 - 512) // 16],
                            tables[3][(513 - 512) // 16]]
    assert group.windowed(4000) is group  # a window past every length changes nothing

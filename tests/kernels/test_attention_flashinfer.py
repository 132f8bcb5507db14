"""The FlashInfer backend on the CPU: its page table, its availability checks, and its plumbing (plan once
per step, decode vs prefill wrapper, append, torch fallback) over a torch stand-in for flashinfer."""

from __future__ import annotations

import math
import sys
import types

import fake_flashinfer
import pytest
import torch
from paged_attention_oracle import TOLERANCE, check_forward_contract, make_sequences, oracle

from kernels.attention import AttentionMetadata, BackendUnavailableError, create_backend
from kernels.attention.flashinfer import FlashInferBackend
from kernels.attention.flashinfer_plan import build_page_table

HEAD_DIM, BLOCK_SIZE = 64, 4
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


@pytest.mark.parametrize(("query_lens", "seq_lens"), [
    ([37], [37]), ([20], [50]), ([1] * 5, [1, 4, 5, 17, 33]), ([1, 12, 1, 20, 1, 6], [9, 12, 30, 30, 2, 6]),
])
def test_page_table_matches_the_metadata(query_lens: list[int], seq_lens: list[int]) -> None:
    seqs = make_sequences(seq_lens, [s - q for q, s in zip(query_lens, seq_lens, strict=True)], 1, 2,
                          BLOCK_SIZE, torch.float32, seed=1)
    meta = AttentionMetadata.build(query_lens, seq_lens, seqs.tables, BLOCK_SIZE, "cpu")
    table = build_page_table(meta)
    assert table.buffer.dtype == torch.int32 and not table.buffer.is_pinned()
    assert table.qo_indptr.tolist() == meta.query_starts
    pages = [math.ceil(s / BLOCK_SIZE) for s in seq_lens]
    assert table.kv_indptr.tolist() == [sum(pages[:i]) for i in range(len(pages) + 1)]
    assert table.kv_indices.tolist() == [b for t, n in zip(seqs.tables, pages, strict=True) for b in t[:n]]
    assert table.kv_last_page_len.tolist() == [s - (n - 1) * BLOCK_SIZE for s, n in zip(seq_lens, pages, strict=True)]
    assert all(1 <= n <= BLOCK_SIZE for n in table.kv_last_page_len.tolist())
    slots = []  # where append_paged_kv_cache puts each token = the metadata's slot
    for b, pos in zip(table.batch_indices.tolist(), table.positions.tolist(), strict=True):
        page = table.kv_indices[table.kv_indptr[b] + pos // BLOCK_SIZE]
        slots.append(int(page) * BLOCK_SIZE + pos % BLOCK_SIZE)
    assert slots == meta.slot_mapping.tolist()
    moved = table.on(torch.device("cpu"))
    assert torch.equal(moved.kv_indices, table.kv_indices) and torch.equal(moved.positions, table.positions)


def test_page_table_reads_host_tables_not_the_device_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = AttentionMetadata.build([3], [7], [[5, 2]], BLOCK_SIZE, "cpu")
    assert meta.host_block_tables is not None and meta.tables_on_host() is meta.host_block_tables
    bare = AttentionMetadata([3], [7], meta.block_tables, meta.slot_mapping, BLOCK_SIZE)
    assert bare.tables_on_host() is bare.block_tables
    assert build_page_table(bare).kv_indices.tolist() == [5, 2]
    with pytest.raises(ValueError, match="host_block_tables"):
        AttentionMetadata([3], [7], meta.block_tables, meta.slot_mapping, BLOCK_SIZE,
                          host_block_tables=torch.zeros(1, 3, dtype=torch.int32))


@no_cuda
def test_check_available_raises_without_cuda_and_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # importing it would now fail loudly
    with pytest.raises(BackendUnavailableError, match="no CUDA device"):
        FlashInferBackend.check_available()
    with pytest.raises(BackendUnavailableError, match=r"'flashinfer' is unavailable.*kernels\.attention\.flashinfer"):
        create_backend("flashinfer", "cpu")
    with pytest.raises(BackendUnavailableError, match="CUDA devices only"):
        FlashInferBackend("cpu")


def test_unimportable_flashinfer_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(BackendUnavailableError, match="importing flashinfer failed"):
        FlashInferBackend.check_available()


@pytest.mark.parametrize("name", [None, "auto"])
def test_auto_on_cpu_takes_a_cpu_backend(name: str | None) -> None:
    assert create_backend(name, "cpu").name in ("cpu_native", "torch")
    assert "flashinfer" not in sys.modules


def fake_backend() -> FlashInferBackend:
    return FlashInferBackend("cpu", flashinfer_module=types.SimpleNamespace(**vars(fake_flashinfer)),
                             workspace_mib=1)


def run_steps(backend: FlashInferBackend, steps: list[tuple[list[int], list[int]]], heads: tuple[int, int],
              dtype: torch.dtype, layers: int = 2, windows: tuple[int | None, ...] = (None,)) -> None:
    """Each step planned once, run over ``layers`` caches; output vs the float64 oracle, new K/V in place."""
    total = [max(s[i] for _, s in steps if i < len(s)) for i in range(len(steps[0][1]))]
    first = steps[0]
    context = [s - q for q, s in zip(*first, strict=True)]
    base = make_sequences(total, context, heads[1], HEAD_DIM, BLOCK_SIZE, dtype, seed=0)
    caches = [base] + [make_sequences(total, context, heads[1], HEAD_DIM, BLOCK_SIZE, dtype, seed=10 + layer,
                                      tables=base.tables) for layer in range(1, layers)]  # one table, like the pool
    for n, (query_lens, seq_lens) in enumerate(steps):
        meta, q, _, _ = caches[0].step(query_lens, seq_lens, heads[0], seed=100 + n)
        backend.plan(meta)
        for i, layer in enumerate(caches):
            window = windows[i % len(windows)]
            _, _, k, v = layer.step(query_lens, seq_lens, heads[0], seed=100 + n)
            if window is None:
                out = backend.forward(q, k, v, layer.cache, HEAD_DIM**-0.5)
            else:
                out = backend.forward(q, k, v, layer.cache, HEAD_DIM**-0.5, window=window)
            assert out.shape == q.shape and out.dtype == dtype
            want = oracle(q, layer, query_lens, seq_lens, HEAD_DIM**-0.5, window=window)
            torch.testing.assert_close(out.double(), want, atol=TOLERANCE[dtype], rtol=0)
            slots = meta.slot_mapping
            assert torch.equal(layer.cache[slots // BLOCK_SIZE, 0, slots % BLOCK_SIZE], k)
            assert torch.equal(layer.cache[slots // BLOCK_SIZE, 1, slots % BLOCK_SIZE], v)


@pytest.mark.parametrize("heads", [(9, 3), (8, 8), (32, 8)])
def test_prefill_prefix_decode_and_mixed_steps_over_the_stand_in(heads: tuple[int, int]) -> None:
    backend = fake_backend()
    run_steps(backend, [([25, 10], [25, 10]), ([25, 13], [50, 23]), ([1, 1], [51, 24]), ([1, 6], [52, 30])],
              heads, torch.bfloat16)
    prefill, decode = backend._prefill, backend._decode
    assert len(prefill.plans) == 3 and prefill.runs == 3 * 2  # one plan per step, one run per layer
    assert len(decode.plans) == 1 and decode.runs == 2
    assert [p.causal for p in prefill.plans] == [True] * 3
    assert prefill.backend == "auto" and decode.use_tensor_cores


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # float32: through the torch backend
def test_sliding_window_layers_plan_their_own_wrappers_once_a_step(dtype: torch.dtype) -> None:
    """Layers alternate full and window 7 (Gemma's pattern): each kind plans its wrapper once per step with
    FlashInfer's window_left = W - 1, and every layer matches the oracle's window."""
    backend = fake_backend()
    run_steps(backend, [([25, 10], [25, 10]), ([25, 13], [50, 23]), ([1, 1], [51, 24])], (8, 2), dtype, layers=4,
              windows=(7, None))
    if dtype == torch.float32:
        return
    (full_prefill, full_decode), (window_prefill, window_decode) = backend._wrappers[None], backend._wrappers[7]
    assert [p.window_left for p in window_prefill.plans] == [6, 6]
    assert [p.window_left for p in window_decode.plans] == [6]
    assert [p.window_left for p in full_prefill.plans] == [-1, -1] and len(full_decode.plans) == 1
    assert window_prefill.runs == full_prefill.runs == 2 * 2 and window_decode.runs == full_decode.runs == 2


def test_float32_steps_run_the_torch_backend() -> None:
    backend = fake_backend()
    run_steps(backend, [([9, 1], [20, 7]), ([1, 1], [21, 8])], (9, 3), torch.float32)
    assert not backend._prefill.plans and not backend._decode.plans


def test_forward_checks() -> None:
    backend = fake_backend()
    seqs, q, k, v = check_forward_contract(backend, torch.bfloat16, HEAD_DIM, BLOCK_SIZE)
    with pytest.raises(ValueError, match="does not fit"):
        backend.forward(q[:, :8], k, v, seqs.cache, 1.0)

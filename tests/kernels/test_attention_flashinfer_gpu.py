"""FlashInfer on a real GPU against the float64 oracle and the torch reference backend on the same device:
prefill from scratch, after a cached prefix, batched decode, mixed steps, chunked prefill then decode, sliding
windows, on permuted blocks of a garbage-filled cache (NaN and ±1e30 outside each sequence), bf16 and fp16, GQA.
Skipped where CUDA is absent (``gpu`` marker) or flashinfer does not import."""

from __future__ import annotations

import pytest
import torch
from paged_attention_oracle import make_sequences, oracle

from kernels.attention import TorchPagedAttention

pytestmark = pytest.mark.gpu

BLOCK_SIZE = 16
HEADS = [(9, 3), (8, 8), (32, 8)]
DTYPES = [torch.bfloat16, torch.float16]  # each (dtype, head dim) is one more FlashInfer JIT module to compile
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3}
"""Absolute error allowed against the float64 oracle and between the two backends (outputs are O(1))."""


@pytest.fixture(scope="module")
def flashinfer_backend():
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed (the 'gpu' extra)")
    from kernels.attention.flashinfer import FlashInferBackend

    return FlashInferBackend("cuda")


def check_steps(backend, steps, heads, dtype, head_dim=64, layers=2, windows=(None,)) -> None:
    """Every step: one plan, ``layers`` forwards; FlashInfer vs the oracle and vs the torch backend on
    the same GPU (given the same cache), and the new K/V exactly in their slots."""
    total = [max(s[i] for _, s in steps if i < len(s)) for i in range(len(steps[0][1]))]
    context = [s - q for q, s in zip(*steps[0], strict=True)]
    base = make_sequences(total, context, heads[1], head_dim, BLOCK_SIZE, dtype, seed=0, device="cuda")
    caches = [base] + [make_sequences(total, context, heads[1], head_dim, BLOCK_SIZE, dtype, seed=10 + i,
                                      device="cuda", tables=base.tables) for i in range(1, layers)]
    reference = TorchPagedAttention("cuda")
    scale = head_dim**-0.5
    for n, (query_lens, seq_lens) in enumerate(steps):
        meta, q, _, _ = base.step(query_lens, seq_lens, heads[0], seed=100 + n)
        q = q.cuda()
        backend.plan(meta)
        reference.plan(meta)
        for i, layer in enumerate(caches):
            window = windows[i % len(windows)]
            extra = {} if window is None else {"window": window}
            _, _, k, v = layer.step(query_lens, seq_lens, heads[0], seed=100 + n)
            before = layer.cache.clone()
            want_torch = reference.forward(q, k, v, before, scale, **extra)
            out = backend.forward(q, k, v, layer.cache, scale, **extra)
            torch.cuda.synchronize()
            assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
            want = oracle(q, layer, query_lens, seq_lens, scale, window=window)
            torch.testing.assert_close(out.double().cpu(), want, atol=TOLERANCE[dtype], rtol=0)
            torch.testing.assert_close(out, want_torch, atol=TOLERANCE[dtype], rtol=0)
            slots = meta.slot_mapping
            assert torch.equal(layer.cache[slots // BLOCK_SIZE, 0, slots % BLOCK_SIZE], k)
            assert torch.equal(layer.cache[slots // BLOCK_SIZE, 1, slots % BLOCK_SIZE], v)
            assert torch.equal(layer.cache.nan_to_num(), before.nan_to_num()), "append wrote outside its slots"


@pytest.mark.parametrize("dtype", [torch.bfloat16])
@pytest.mark.parametrize("heads", HEADS)
def test_prefill_from_scratch(flashinfer_backend, heads, dtype) -> None:
    check_steps(flashinfer_backend, [([300], [300])], heads, dtype)
    check_steps(flashinfer_backend, [([5, 170, 2, 33], [5, 170, 2, 33])], heads, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
@pytest.mark.parametrize("heads", HEADS)
def test_prefill_after_cached_prefix(flashinfer_backend, heads, dtype) -> None:
    check_steps(flashinfer_backend, [([200], [1000])], heads, dtype)
    check_steps(flashinfer_backend, [([3, 90, 17], [4, 241, 17 + 15])], heads, dtype)  # mid-block prefixes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS)
def test_batched_decode(flashinfer_backend, heads, dtype) -> None:
    lens = [1, 17, 16, 33, 1000, 4, 5, 2049] + [100 + 37 * i for i in range(56)]
    check_steps(flashinfer_backend, [([1] * len(lens), lens)], heads, dtype)


@pytest.mark.parametrize("heads", HEADS)
def test_mixed_and_chunked_steps(flashinfer_backend, heads) -> None:
    steps = [([250, 100], [250, 100]), ([250, 130], [500, 230]), ([190, 1], [690, 231]), ([1, 1], [691, 232]),
             ([1, 7], [692, 239])]
    check_steps(flashinfer_backend, steps, heads, torch.bfloat16, layers=3)


@pytest.mark.parametrize("window", [1, 24, 512])
def test_sliding_window_layers_match_transformers_window(flashinfer_backend, window) -> None:
    """Layers alternate a sliding window and full attention (Gemma 3's head dim 256): prefill past the window,
    a cached prefix, mixed and decode steps; FlashInfer's window_left = W - 1 against the oracle's window."""
    steps = [([300, 40], [300, 40]), ([200, 1], [700, 41]), ([1, 1], [701, 42]), ([1, 9], [702, 51])]
    check_steps(flashinfer_backend, steps, (8, 4), torch.bfloat16, head_dim=256, layers=4, windows=(window, None))


def test_head_dim_128(flashinfer_backend) -> None:
    check_steps(flashinfer_backend, [([64, 1], [300, 77]), ([1, 1], [301, 78])], (32, 8), torch.bfloat16, head_dim=128)


def test_float32_runs_the_torch_backend(flashinfer_backend) -> None:
    """float32 (the exact-parity mode) is not a FlashInfer dtype: same answers as the torch backend."""
    seqs = make_sequences([40, 9], [30, 8], 3, 64, BLOCK_SIZE, torch.float32, seed=3, device="cuda")
    meta, q, k, v = seqs.step([10, 1], [40, 9], 9, seed=4)
    flashinfer_backend.plan(meta)
    out = flashinfer_backend.forward(q.cuda(), k, v, seqs.cache, 0.125)
    torch.testing.assert_close(out.double().cpu(), oracle(q, seqs, [10, 1], [40, 9], 0.125), atol=2e-5, rtol=0)

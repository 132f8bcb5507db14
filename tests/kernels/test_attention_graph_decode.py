"""Decode attention over fixed buffers (what a CUDA graph replays), on the CPU: the pure-torch one and
FlashInfer's CUDA-graph mode over the torch stand-in for flashinfer. A step padded to a captured size
attends like the float64 oracle on its real rows, its padding rows write only the sink block, and
buffers reused by a smaller step keep nothing of the larger one."""

from __future__ import annotations

import fake_flashinfer
import pytest
import torch
from paged_attention_oracle import TOLERANCE, make_sequences, oracle

from kernels.attention import AttentionMetadata
from kernels.attention.flashinfer_graph import FlashInferGraphDecode
from kernels.attention.graph_decode import GraphDecodeAttention, TorchGraphDecode

BLOCK, HEAD_DIM, HEADS, KV_HEADS = 4, 64, 6, 2
SCALE = HEAD_DIM**-0.5
MAX_PAGES = 8


def make(kind: str, dtype: torch.dtype) -> GraphDecodeAttention:
    if kind == "torch":
        return TorchGraphDecode("cpu", 8, MAX_PAGES, BLOCK)
    return FlashInferGraphDecode("cpu", (1, 2, 4, 8), MAX_PAGES, BLOCK, (HEADS, KV_HEADS, HEAD_DIM), dtype, SCALE,
                                 flashinfer_module=fake_flashinfer)


def padded_step(seq_lens: list[int], bucket: int, seed: int, dtype: torch.dtype):
    """A decode step of ``seq_lens`` padded to ``bucket`` rows on a sink block appended to the cache."""
    seqs = make_sequences(seq_lens, [s - 1 for s in seq_lens], KV_HEADS, HEAD_DIM, BLOCK, dtype, seed=seed)
    sink = seqs.cache.shape[0]
    cache = torch.cat([seqs.cache, torch.zeros_like(seqs.cache[:1])])
    n, pad = len(seq_lens), bucket - len(seq_lens)
    _, q, k, v = seqs.step([1] * n, seq_lens, HEADS, seed=seed)
    meta = AttentionMetadata.build([1] * bucket, [*seq_lens, *[1] * pad], [*seqs.tables, *[[sink]] * pad], BLOCK,
                                   "cpu")
    gen = torch.Generator().manual_seed(seed + 100)
    pad_qkv = [torch.randn(pad, h, HEAD_DIM, generator=gen).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS)]
    q, k, v = (torch.cat([x, extra]) for x, extra in zip((q, k, v), pad_qkv, strict=True))
    return seqs, cache, meta, q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["torch", "flashinfer"])
def test_a_padded_step_attends_like_the_oracle_and_pads_only_into_the_sink(kind, dtype):
    attention = make(kind, dtype)
    for seq_lens, bucket, seed in (([9, 30, 2], 4, 1), ([5], 2, 2), ([17, 3, 12, 29, 1], 8, 3)):
        seqs, cache, meta, q, k, v = padded_step(seq_lens, bucket, seed, dtype)
        before = cache.clone()
        attention.plan(meta)
        out = attention.forward(q, k, v, cache, SCALE)
        n = len(seq_lens)
        expected = oracle(q[:n], seqs, [1] * n, seq_lens, SCALE)
        assert out.shape == q.shape and out.dtype == dtype
        assert (out[:n].double() - expected).abs().max() <= TOLERANCE[dtype] * 4
        written = cache.ne(before) & ~(cache.isnan() & before.isnan())
        touched = {int(b) for b in written.nonzero()[:, 0]}
        sink = cache.shape[0] - 1
        last_blocks = {table[(s - 1) // BLOCK] for table, s in zip(seqs.tables, seq_lens, strict=True)}
        assert touched <= last_blocks | {sink} and sink in touched
        for i, (table, s) in enumerate(zip(seqs.tables, seq_lens, strict=True)):
            block, offset = table[(s - 1) // BLOCK], (s - 1) % BLOCK
            assert torch.equal(cache[block, 0, offset], k[i]) and torch.equal(cache[block, 1, offset], v[i])


@pytest.mark.parametrize("kind", ["torch", "flashinfer"])
def test_steps_the_buffers_cannot_hold_are_refused(kind):
    attention = make(kind, torch.bfloat16)
    prefill = AttentionMetadata.build([2, 1], [5, 3], [[1, 2], [3]], BLOCK, "cpu")
    with pytest.raises(ValueError, match=r"decode-only steps; sequences \[0\]"):
        attention.plan(prefill)
    too_long = AttentionMetadata.build([1], [MAX_PAGES * BLOCK + 1], [list(range(1, MAX_PAGES + 2))], BLOCK, "cpu")
    with pytest.raises(ValueError, match=f"needs {MAX_PAGES + 1} pages; the buffers hold {MAX_PAGES}"):
        attention.plan(too_long)
    too_many = AttentionMetadata.build([1] * 9, [1] * 9, [[1]] * 9, BLOCK, "cpu")
    with pytest.raises(ValueError, match="9 sequences; the buffers hold 1 to 8"):
        attention.plan(too_many)


def test_flashinfer_graph_decode_plans_only_captured_sizes_and_appends_through_its_buffers():
    attention = make("flashinfer", torch.bfloat16)
    three = AttentionMetadata.build([1] * 3, [1] * 3, [[1]] * 3, BLOCK, "cpu")
    with pytest.raises(ValueError, match=r"no graph of 3 rows; captured sizes: \[1, 2, 4, 8\]"):
        attention.plan(three)
    _, cache, meta, q, k, v = padded_step([6, 11], 2, 5, torch.bfloat16)
    attention.plan(meta)
    assert attention.positions[:2].tolist() == [5, 10]
    assert attention.kv_indptr[:3].tolist() == [0, 2, 5]  # the wrapper's own copy went into the shared buffers
    wrapper = attention._wrappers[2]
    assert wrapper.use_cuda_graph and wrapper.plans[-1].kv_indptr.data_ptr() == attention.kv_indptr.data_ptr()
    with pytest.raises(ValueError, match="planned for scale"):
        attention.forward(q, k, v, cache, 1.0)

"""TorchPagedAttention against a dense float64 oracle, on garbage-filled caches with permuted blocks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from paged_attention_oracle import TOLERANCE, check_forward_contract, make_sequences, oracle

from kernels.attention import TorchPagedAttention, torch_decode

HEAD_DIM, BLOCK_SIZE = 16, 4
GQA = [(4, 4), (9, 3), (8, 2)]  # (query heads, KV heads): ratios 1, 3, 4
DTYPES = [torch.float32, torch.bfloat16]
IMPLS = ["auto", "sdpa", "bag"]


def run_step(
    query_lens: list[int],
    seq_lens: list[int],
    heads: tuple[int, int],
    dtype: torch.dtype,
    decode_impl: str = "auto",
    seed: int = 0,
    device: str = "cpu",
    **backend_kwargs: int,
) -> None:
    """One step over fresh sequences: the output matches the oracle, the new K/V land in their slots."""
    num_heads, num_kv_heads = heads
    context = [s - q for q, s in zip(query_lens, seq_lens, strict=True)]
    seqs = make_sequences(seq_lens, context, num_kv_heads, HEAD_DIM, BLOCK_SIZE, dtype, seed, device=device)
    meta, q, k, v = seqs.step(query_lens, seq_lens, num_heads, seed + 1)
    backend = TorchPagedAttention(device, decode_impl=decode_impl, **backend_kwargs)
    backend.plan(meta)
    scale = HEAD_DIM**-0.5
    out = backend.forward(q, k, v, seqs.cache, scale)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    expected = oracle(q, seqs, query_lens, seq_lens, scale)
    torch.testing.assert_close(out.cpu().double(), expected, atol=TOLERANCE[dtype], rtol=0)
    slots = meta.slot_mapping.cpu()
    blocks, offsets = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    cache = seqs.cache.cpu()
    assert torch.equal(cache[blocks, 0, offsets], k.cpu())
    assert torch.equal(cache[blocks, 1, offsets], v.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_prefill_from_scratch(heads: tuple[int, int], dtype: torch.dtype) -> None:
    run_step([37], [37], heads, dtype)
    run_step([5, 17, 2], [5, 17, 2], heads, dtype, seed=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_prefill_after_cached_prefix(heads: tuple[int, int], dtype: torch.dtype) -> None:
    run_step([20], [50], heads, dtype)
    run_step([3, 9], [4, 24], heads, dtype, seed=1)  # prefixes of 1 and 15 tokens (mid-block ends)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_batched_decode(heads: tuple[int, int], dtype: torch.dtype, impl: str) -> None:
    lens = [1, 17, 16, 33, 100, 4, 5]
    run_step([1] * len(lens), lens, heads, dtype, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_single_sequence_decode(dtype: torch.dtype, impl: str) -> None:
    run_step([1], [45], (9, 3), dtype, impl)
    run_step([1], [1], (9, 3), dtype, impl, seed=1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_decode_batch_auto_and_groups(dtype: torch.dtype, impl: str) -> None:
    """Lengths spread widely: a few length groups, one group per length with zero allowed waste, a
    single group of 16 with no limit."""
    lens = [3 + (i * 37) % 60 for i in range(14)] + [150, 151]
    run_step([1] * len(lens), lens, (9, 3), dtype, impl, group_waste_tokens=64)
    run_step([1] * len(lens), lens, (9, 3), dtype, impl, seed=1, group_waste_tokens=0)
    run_step([1] * len(lens), lens, (9, 3), dtype, impl, seed=2, group_waste_tokens=10**6)


@pytest.mark.parametrize(
    ("num_seqs", "seq_len", "num_kv_heads", "expected"),
    [(8, 510, 3, "bag"), (1, 4096, 2, "bag"), (7, 512, 3, "sdpa"), (40, 9, 3, "sdpa"), (8, 510, 8, "sdpa")],
)
def test_auto_decode_choice_on_cpu(
    monkeypatch: pytest.MonkeyPatch, num_seqs: int, seq_len: int, num_kv_heads: int, expected: str
) -> None:
    chosen: list[str] = []
    for name, impl in list(torch_decode.DECODE_IMPLS.items()):

        def spy(*args: object, _name: str = name, _impl: Callable[..., torch.Tensor] = impl) -> torch.Tensor:
            chosen.append(_name)
            return _impl(*args)

        monkeypatch.setitem(torch_decode.DECODE_IMPLS, name, spy)
    run_step([1] * num_seqs, [seq_len] * num_seqs, (num_kv_heads * 2, num_kv_heads), torch.float32)
    assert chosen == [expected]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_mixed_batch(heads: tuple[int, int], dtype: torch.dtype, impl: str) -> None:
    """Decode, prefill from scratch and prefill after a prefix interleaved in one step."""
    run_step([1, 12, 1, 20, 1, 6], [9, 12, 30, 30, 2, 6], heads, dtype, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_prefill_then_decode(dtype: torch.dtype, impl: str) -> None:
    """Two sequences prefilled in chunks over several steps on one cache, then decoded; each step
    reads what the previous steps' forward wrote."""
    total = [70, 24]
    seqs = make_sequences(total, [0, 0], 3, HEAD_DIM, BLOCK_SIZE, dtype, seed=3)
    backend = TorchPagedAttention("cpu", decode_impl=impl)
    scale = 0.3
    schedule = [([25, 10], [25, 10]), ([25, 13], [50, 23]), ([19, 1], [69, 24]), ([1], [70])]
    for step, (query_lens, seq_lens) in enumerate(schedule):
        if len(query_lens) == 1:  # the short sequence finished; decode the long one alone
            seqs.keys, seqs.values, seqs.tables = seqs.keys[:1], seqs.values[:1], seqs.tables[:1]
        meta, q, k, v = seqs.step(query_lens, seq_lens, 9, seed=10 + step)
        backend.plan(meta)
        out = backend.forward(q, k, v, seqs.cache, scale)
        expected = oracle(q, seqs, query_lens, seq_lens, scale)
        torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)


def test_layers_share_one_plan() -> None:
    """One plan serves every layer: two caches (layers) with different contents, same step."""
    first = make_sequences([30, 7], [29, 3], 3, HEAD_DIM, BLOCK_SIZE, torch.float32, seed=5)
    second = make_sequences([30, 7], [29, 3], 3, HEAD_DIM, BLOCK_SIZE, torch.float32, seed=6, tables=first.tables)
    layers = [first, second]
    backend = TorchPagedAttention("cpu")
    meta, q, _, _ = layers[0].step([1, 4], [30, 7], 9, seed=7)
    backend.plan(meta)
    for layer in layers:
        _, _, k, v = layer.step([1, 4], [30, 7], 9, seed=7)
        out = backend.forward(q, k, v, layer.cache, 0.25)
        torch.testing.assert_close(out.double(), oracle(q, layer, [1, 4], [30, 7], 0.25), atol=2e-5, rtol=0)


def test_non_contiguous_cache_view() -> None:
    """A layer's cache may be a strided view into a bigger allocation."""
    seqs = make_sequences([9, 21], [8, 5], 3, HEAD_DIM, BLOCK_SIZE, torch.float32, seed=8)
    big = torch.zeros((seqs.cache.shape[0], 3, *seqs.cache.shape[1:]))
    big[:, 1] = seqs.cache
    seqs.cache = big[:, 1]
    assert not seqs.cache.is_contiguous()
    meta, q, k, v = seqs.step([1, 16], [9, 21], 9, seed=9)
    backend = TorchPagedAttention("cpu")
    backend.plan(meta)
    out = backend.forward(q, k, v, seqs.cache, 0.25)
    torch.testing.assert_close(out.double(), oracle(q, seqs, [1, 16], [9, 21], 0.25), atol=2e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_qkv_views_of_a_fused_projection(impl: str) -> None:
    """q, k, v arrive as strided views into one fused projection output."""
    query_lens, seq_lens = [1] * 12 + [6], [5 + 3 * i for i in range(12)] + [10]
    seqs = make_sequences(
        seq_lens,
        [s - q for q, s in zip(query_lens, seq_lens, strict=True)],
        3,
        HEAD_DIM,
        BLOCK_SIZE,
        torch.float32,
        seed=4,
    )
    meta, q, k, v = seqs.step(query_lens, seq_lens, 9, seed=5)
    fused = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    q_view, k_view, v_view = (
        t.view(-1, n, HEAD_DIM)
        for t, n in zip(fused.split([9 * HEAD_DIM, 3 * HEAD_DIM, 3 * HEAD_DIM], dim=1), (9, 3, 3), strict=True)
    )
    assert not q_view.is_contiguous()
    backend = TorchPagedAttention("cpu", decode_impl=impl)
    backend.plan(meta)
    out = backend.forward(q_view, k_view, v_view, seqs.cache, 0.25)
    torch.testing.assert_close(out.double(), oracle(q, seqs, query_lens, seq_lens, 0.25), atol=2e-5, rtol=0)


def test_forward_checks() -> None:
    backend = TorchPagedAttention("cpu")
    seqs, q, k, v = check_forward_contract(backend, torch.float32, HEAD_DIM, BLOCK_SIZE)
    with pytest.raises(TypeError, match="dtype"):
        backend.forward(q, k.double(), v.double(), seqs.cache, 1.0)
    with pytest.raises(ValueError, match="decode_impl"):
        TorchPagedAttention("cpu", decode_impl="fast")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_mixed_batch(dtype: torch.dtype, impl: str) -> None:
    run_step([1, 12, 1, 20, 1], [9, 12, 30, 30, 2], (9, 3), dtype, impl, device="cuda")
    lens = [3 + (i * 37) % 90 for i in range(16)]
    run_step([1] * len(lens), lens, (8, 2), dtype, impl, device="cuda")

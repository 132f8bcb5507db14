"""What the pure-torch backend computes from explicit float32 scores, against the dense float64 oracle:
attention sinks (GPT-OSS: a learned logit per head joins every softmax, with no value), a logit softcap
(Gemma 2: each score s becomes cap * tanh(s / cap)), and both. Prefill from scratch and after a cached prefix,
decode groups of mixed lengths (the bag implementation is never picked for them), a mixed step, with and
without a sliding window; sinks of -inf are no sinks; the native backend's kernel computes them (with windows)
in its decode rows, on its portable and AVX-512 loops and split across threads; which backends take them."""

from __future__ import annotations

import pytest
import torch
from paged_attention_oracle import TOLERANCE, make_sequences, oracle

from kernels.attention import TorchPagedAttention
from kernels.attention.registry import BackendUnavailableError, create_backend

HEAD_DIM, BLOCK_SIZE, HEADS = 16, 4, (8, 2)
SOFTCAP = 1.5  # below the largest scores of the random steps (|s| up to ~4): the cap changes every softmax
KINDS = {"sinks": dict(sinks=True), "softcap": dict(softcap=SOFTCAP), "both": dict(sinks=True, softcap=SOFTCAP)}


def _step(query_lens: list[int], seq_lens: list[int], dtype: torch.dtype, seed: int):
    num_heads, num_kv_heads = HEADS
    context = [s - q for q, s in zip(query_lens, seq_lens, strict=True)]
    seqs = make_sequences(seq_lens, context, num_kv_heads, HEAD_DIM, BLOCK_SIZE, dtype, seed)
    meta, q, k, v = seqs.step(query_lens, seq_lens, num_heads, seed + 1)
    sinks = torch.linspace(-2.0, 3.0, num_heads)  # some below the scores, some above: weight goes to nothing
    return seqs, meta, q, k, v, sinks


def run_explicit(kind: str, query_lens: list[int], seq_lens: list[int], dtype: torch.dtype,
                 window: int | None = None, decode_impl: str = "auto", seed: int = 0) -> None:
    seqs, meta, q, k, v, sinks = _step(query_lens, seq_lens, dtype, seed)
    options = {"sinks": sinks if KINDS[kind].get("sinks") else None, "softcap": KINDS[kind].get("softcap")}
    backend = TorchPagedAttention("cpu", decode_impl=decode_impl)
    backend.plan(meta)
    scale = HEAD_DIM**-0.5
    out = backend.forward(q, k, v, seqs.cache, scale, window=window, **options)
    expected = oracle(q, seqs, query_lens, seq_lens, scale, window=window, **options)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)
    plain = backend.forward(q, k, v, seqs.cache, scale, window=window)  # the same plan, a plain layer
    assert (out.double() - plain.double()).abs().max() > 0.01 * plain.double().abs().max()  # they change it


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_prefill_from_scratch_and_after_a_prefix(kind, window, dtype) -> None:
    run_explicit(kind, [37], [37], dtype, window)
    run_explicit(kind, [20], [50], dtype, window, seed=1)
    run_explicit(kind, [3, 9], [4, 24], dtype, window, seed=2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("impl", ["auto", "sdpa", "bag"])  # bag asked for: sdpa's path runs (bag has neither)
@pytest.mark.parametrize("window", [None, 6])
def test_decode_groups(kind, impl, window) -> None:
    run_explicit(kind, [1], [29], torch.float32, window, impl)
    run_explicit(kind, [1, 1, 1, 1], [3, 29, 17, 40], torch.float32, window, impl, seed=3)
    run_explicit(kind, [1] * 6, [700, 650, 800, 720, 690, 710], torch.float32, window, impl, seed=5)  # bag's size


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_step_of_prefills_and_decodes(kind) -> None:
    run_explicit(kind, [1, 12, 1, 30], [33, 40, 9, 30], torch.float32, seed=4)
    run_explicit(kind, [1, 12, 1, 30], [33, 40, 9, 30], torch.float32, window=10, seed=4)


def test_sinks_of_minus_infinity_are_no_sinks() -> None:
    seqs, meta, q, k, v, sinks = _step([1, 12, 1], [33, 40, 9], torch.float32, seed=6)
    backend = TorchPagedAttention("cpu")
    backend.plan(meta)
    none = backend.forward(q, k, v, seqs.cache, 0.25)
    vanishing = backend.forward(q, k, v, seqs.cache, 0.25, sinks=torch.full_like(sinks, float("-inf")))
    torch.testing.assert_close(vanishing, none, atol=2e-6, rtol=0)


def test_a_cap_far_above_the_scores_changes_nothing() -> None:
    seqs, meta, q, k, v, _ = _step([1, 12, 1], [33, 40, 9], torch.float32, seed=6)
    backend = TorchPagedAttention("cpu")
    backend.plan(meta)
    torch.testing.assert_close(backend.forward(q, k, v, seqs.cache, 0.25, softcap=1e6),
                               backend.forward(q, k, v, seqs.cache, 0.25), atol=2e-6, rtol=0)


def test_backends_declare_what_they_take() -> None:
    torch_backend, fixed = create_backend("torch", "cpu"), create_backend("cpu_fixed_order", "cpu")
    assert torch_backend.supports_sinks and torch_backend.supports_softcap
    assert not fixed.supports_sinks and not fixed.supports_softcap


def _native_backend():
    """The native backend, with its kernel's decode calls counted (``backend.kernel_calls``)."""
    try:
        backend = create_backend("cpu_native", "cpu")
    except BackendUnavailableError as exc:  # no compiler here: the kernel's own tests skip too
        pytest.skip(f"cpu_native unavailable: {exc}")
    calls, kernel = [], backend._decode
    backend._decode = lambda *args: calls.append(1) or kernel(*args)
    backend.kernel_calls = calls
    return backend


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("window", [None, 7])
def test_the_native_backend_takes_such_layers(kind, window) -> None:
    """Its kernel serves the decode rows (sinks, cap and window inside it), torch the prefill row."""
    backend = _native_backend()
    assert backend.supports_sinks and backend.supports_softcap
    query_lens, seq_lens = [1, 1, 9], [30, 12, 20]
    seqs, meta, q, k, v, sinks = _step(query_lens, seq_lens, torch.float32, seed=7)
    options = {"sinks": sinks if KINDS[kind].get("sinks") else None, "softcap": KINDS[kind].get("softcap")}
    backend.plan(meta)
    scale = HEAD_DIM**-0.5
    out = backend.forward(q, k, v, seqs.cache, scale, window=window, **options)
    expected = oracle(q, seqs, query_lens, seq_lens, scale, window=window, **options)
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[torch.float32], rtol=0)
    assert backend.kernel_calls == [1]
    plain = backend.forward(q, k, v, seqs.cache, scale)  # a plain layer: the kernel's, still exact
    torch.testing.assert_close(plain.double(), oracle(q, seqs, query_lens, seq_lens, scale),
                               atol=TOLERANCE[torch.float32], rtol=0)


# (sequence lengths, block size, query scale): a batch of mixed lengths (a sequence a thread) in blocks of 4;
# one long sequence alone in blocks of 16 (full 16-row tiles), which the kernel splits across threads (split-KV,
# merged after) where its window holds enough positions; one in blocks of 32 (a window starting mid-block, past a
# tile's 16 rows) with queries 30x larger, so that scores far exceed the cap (its tanh saturates)
NATIVE_STEPS = (([3, 29, 17, 40, 64], 4, 1.0), ([1000], 16, 1.0), ([301], 32, 30.0))


@pytest.mark.parametrize("kind", [*KINDS, "none"])
@pytest.mark.parametrize("head_dim", [16, 64, 128])  # the portable loop; AVX-512's (dims of 32k), where built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5, 300, 317])
def test_the_native_kernel_takes_windows_sinks_and_caps_on_every_path(kind, head_dim, dtype, window) -> None:
    """Decode steps of the native kernel against the oracle (see ``NATIVE_STEPS``); windows starting inside
    blocks and at block edges."""
    backend = _native_backend()
    spec = KINDS.get(kind, {})
    num_heads, num_kv_heads = HEADS
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))  # split-KV needs two threads
    try:
        for seed, (seq_lens, block_size, query_scale) in enumerate(NATIVE_STEPS):
            query_lens = [1] * len(seq_lens)
            seqs = make_sequences(seq_lens, [s - 1 for s in seq_lens], num_kv_heads, head_dim, block_size, dtype,
                                  seed)
            meta, q, k, v = seqs.step(query_lens, seq_lens, num_heads, seed + 1)
            q = (q.float() * query_scale).to(dtype)
            sinks = torch.linspace(-2.0, 3.0, num_heads)
            options = {"sinks": sinks if spec.get("sinks") else None, "softcap": spec.get("softcap")}
            backend.plan(meta)
            backend.kernel_calls.clear()
            scale = head_dim**-0.5
            out = backend.forward(q, k, v, seqs.cache, scale, window=window, **options)
            expected = oracle(q, seqs, query_lens, seq_lens, scale, window=window, **options)
            torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)
            assert backend.kernel_calls == [1], "the decode step did not run the kernel"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("budget", [1, 40, 1000])  # a row at a time, a few rows, a few sequences per piece
def test_pieces_under_the_score_budget_give_the_same_attention(monkeypatch, budget) -> None:
    """Long prompts are computed in pieces of at most ``SCORE_BUDGET`` scores: every piecing gives the oracle's
    numbers, in prefills (from scratch: causal; after a prefix: the mask) and decode groups."""
    from kernels.attention import explicit

    monkeypatch.setattr(explicit, "SCORE_BUDGET", budget)
    run_explicit("both", [37], [37], torch.float32)
    run_explicit("both", [20], [50], torch.float32, window=5, seed=1)
    run_explicit("both", [1, 1, 1, 1], [3, 29, 17, 40], torch.float32, seed=3)

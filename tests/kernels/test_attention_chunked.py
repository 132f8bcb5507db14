"""Chunked attention (Llama 4's rotated layers; ``kernels.attention.chunked``): each CPU backend, wrapped in
``ChunkedAttention``, against the dense float64 oracle with transformers' chunked mask (query position p sees
``p - p % C..p``) on garbage-filled caches: prefills from scratch across several chunks, after a prefix that ends
mid-chunk, decodes at a chunk's first position and past it, a mixed step; the full layers of the same step stay
causal; FlashInfer's backend over its CPU stand-in too. The virtual sequences the step is cut into, exactly."""

from __future__ import annotations

import types

import fake_flashinfer
import pytest
import torch
from paged_attention_oracle import TOLERANCE, make_sequences, oracle

from kernels.attention.chunked import ChunkedAttention, chunked_metadata
from kernels.attention.flashinfer import FlashInferBackend
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.registry import BackendUnavailableError, create_backend

HEAD_DIM, BLOCK_SIZE, HEADS = 16, 4, (8, 2)
STAND_IN = "flashinfer-stand-in"  # FlashInfer's backend over tests/kernels/fake_flashinfer.py (head dims of 64)


def _backend(name: str):
    if name == STAND_IN:
        return FlashInferBackend("cpu", flashinfer_module=types.SimpleNamespace(**vars(fake_flashinfer)),
                                 workspace_mib=1)
    return create_backend(name, "cpu")


def _chunked(name: str) -> ChunkedAttention:
    try:
        return ChunkedAttention(_backend(name), _backend(name), 8)
    except BackendUnavailableError as exc:
        pytest.skip(f"{name}: {exc}")


def run_chunked(name: str, query_lens: list[int], seq_lens: list[int], dtype: torch.dtype, seed: int = 0) -> None:
    num_heads, num_kv_heads = HEADS
    head_dim = 64 if name == STAND_IN else HEAD_DIM
    context = [s - q for q, s in zip(query_lens, seq_lens, strict=True)]
    seqs = make_sequences(seq_lens, context, num_kv_heads, head_dim, BLOCK_SIZE, dtype, seed)
    meta, q, k, v = seqs.step(query_lens, seq_lens, num_heads, seed + 1)
    if name == "cpu_fixed_order":  # the deterministic mode's backend reads each row's kind off the prompt lengths
        meta = AttentionMetadata.build(query_lens, seq_lens, seqs.tables, BLOCK_SIZE, "cpu",
                                       [max(1, s - 2) for s in seq_lens])
    backend = _chunked(name)
    backend.plan(meta)
    scale = head_dim**-0.5
    local = backend.forward(q, k, v, seqs.cache, scale, chunk=8)
    full = backend.forward(q, k, v, seqs.cache, scale)  # the same step's unchunked layer
    torch.testing.assert_close(local.double(), oracle(q, seqs, query_lens, seq_lens, scale, chunk=8),
                               atol=TOLERANCE[dtype], rtol=0)
    torch.testing.assert_close(full.double(), oracle(q, seqs, query_lens, seq_lens, scale), atol=TOLERANCE[dtype],
                               rtol=0)
    if max(seq_lens) > 8:  # some query has positions of an earlier chunk in its causal context
        assert not torch.allclose(local, full)
    else:
        assert torch.equal(local, full)
    if name == STAND_IN and dtype != torch.float32:  # FlashInfer's own wrappers ran the chunked layer (float32
        local_runs = backend.local._prefill.runs + backend.local._decode.runs  # steps run torch's backend)
        assert local_runs == (1 if max(seq_lens) > 8 else 0)


BACKENDS = ["torch", "cpu_native", "cpu_fixed_order", STAND_IN]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", BACKENDS)
def test_prefills_across_chunks_from_scratch_and_after_a_prefix(name: str, dtype: torch.dtype) -> None:
    run_chunked(name, [37], [37], dtype)  # five chunks, the last partial
    run_chunked(name, [20], [50], dtype, seed=1)  # after a prefix of 30: the step starts mid-chunk
    run_chunked(name, [3, 9], [4, 24], dtype, seed=2)
    run_chunked(name, [8], [8], dtype, seed=3)  # exactly one chunk: the full plan serves both


@pytest.mark.parametrize("name", BACKENDS)
def test_decodes_at_a_chunks_first_position_and_past_it(name: str) -> None:
    dtype = torch.bfloat16 if name == STAND_IN else torch.float32
    run_chunked(name, [1], [33], dtype)  # position 32: it sees itself only
    run_chunked(name, [1, 1, 1, 1], [3, 29, 17, 40], dtype, seed=3)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_mixed_step_of_prefills_and_decodes(name: str) -> None:
    run_chunked(name, [1, 12, 1, 30], [9, 12, 25, 45], torch.bfloat16 if name == STAND_IN else torch.float32, seed=4)


def test_the_step_is_cut_at_chunk_boundaries_into_sequences_that_start_there() -> None:
    tables = [list(range(10, 20)), list(range(30, 33))]
    meta = AttentionMetadata.build([20, 1], [37, 9], tables, BLOCK_SIZE, "cpu", prompt_lens=[37, 5])
    local = chunked_metadata(meta, 8)
    # sequence 0 computes positions 17..36: 17..23 (chunk 16), 24..31, 32..36; sequence 1 position 8 (chunk 8)
    assert local.query_lens == [7, 8, 5, 1] and local.seq_lens == [8, 8, 5, 1]
    read = [row[:-(-n // BLOCK_SIZE)] for row, n in zip(local.host_block_tables.tolist(), local.seq_lens, strict=True)]
    assert read == [[14, 15], [16, 17], [18, 19], [32]]  # each from its chunk's first block
    assert local.prompt_lens == [21, 13, 5, 0]
    assert torch.equal(local.slot_mapping, meta.slot_mapping)  # the same rows write the same slots
    assert chunked_metadata(AttentionMetadata.build([5], [8], [[1, 2]], BLOCK_SIZE, "cpu"), 8).seq_lens == [8]


def test_a_chunk_must_be_whole_blocks_and_one_size() -> None:
    meta = AttentionMetadata.build([9], [9], [[1, 2, 3]], BLOCK_SIZE, "cpu")
    with pytest.raises(ValueError, match="multiple of the block size 4"):
        chunked_metadata(meta, 6)
    backend = _chunked("torch")
    backend.plan(meta)
    q = torch.zeros(9, HEADS[0], HEAD_DIM)
    kv = torch.zeros(9, HEADS[1], HEAD_DIM)
    with pytest.raises(ValueError, match="built for chunks of 8, a layer asked for 16"):
        backend.forward(q, kv, kv, torch.zeros(4, 2, BLOCK_SIZE, HEADS[1], HEAD_DIM), 1.0, chunk=16)
    with pytest.raises(TypeError, match="must be the full layers'"):
        ChunkedAttention(create_backend("torch", "cpu"), _chunked("torch"), 8)

"""AttentionMetadata.build and write_kv: where each new token's K/V goes."""

from __future__ import annotations

import pytest
import torch

from kernels.attention import AttentionMetadata, kv_cache_shape, write_kv


def test_build_pads_tables_and_maps_slots() -> None:
    meta = AttentionMetadata.build(
        query_lens=[3, 1, 2],
        seq_lens=[3, 6, 5],
        block_tables=[[7], [2, 9], [4, 0, 5]],
        block_size=4,
        device="cpu",
    )
    assert meta.block_tables.dtype == torch.int32
    assert meta.block_tables.tolist() == [[7, 0, 0], [2, 9, 0], [4, 0, 5]]
    # seq 0: positions 0..2 in block 7; seq 1: position 5 -> block 9 offset 1; seq 2: positions 3, 4.
    assert meta.slot_mapping.dtype == torch.int64
    assert meta.slot_mapping.tolist() == [28, 29, 30, 37, 19, 0]
    assert meta.query_starts == [0, 3, 4, 6]
    assert meta.context_lens == [0, 5, 3]
    assert meta.decode_seqs == [1]
    assert meta.prefill_seqs == [0, 2]
    assert (meta.num_seqs, meta.num_tokens) == (3, 6)


@pytest.mark.parametrize(
    ("query_lens", "seq_lens", "tables", "message"),
    [
        ([2], [1], [[0]], "query_len <= seq_len"),
        ([0], [1], [[0]], "query_len <= seq_len"),
        ([1, 1], [1], [[0], [1]], "seq_lens"),
        ([1], [9], [[0, 1]], "cannot hold"),
        ([1], [1], [[0], [1]], "block tables"),
    ],
)
def test_build_rejects_inconsistent_batches(
    query_lens: list[int], seq_lens: list[int], tables: list[list[int]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        AttentionMetadata.build(query_lens, seq_lens, tables, block_size=4, device="cpu")


def test_direct_construction_is_validated() -> None:
    tables = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="slot_mapping"):
        AttentionMetadata([2], [2], tables, torch.zeros(3, dtype=torch.int64), block_size=4)
    with pytest.raises(ValueError, match="too few"):
        AttentionMetadata([1], [9], tables, torch.zeros(1, dtype=torch.int64), block_size=4)
    with pytest.raises(ValueError, match="int32"):
        AttentionMetadata([1], [1], tables.float(), torch.zeros(1, dtype=torch.int64), block_size=4)


@pytest.mark.parametrize("contiguous", [True, False])
def test_write_kv_puts_values_exactly_at_slots(contiguous: bool) -> None:
    shape = kv_cache_shape(num_blocks=5, block_size=4, num_kv_heads=2, head_dim=3)
    # not contiguous: a layer's view into a bigger allocation
    cache = torch.zeros(shape) if contiguous else torch.zeros((shape[0], 2, *shape[1:]))[:, 1]
    slots = torch.tensor([17, 2, 11, 0])
    k = torch.randn(4, 2, 3)
    v = torch.randn(4, 2, 3)
    write_kv(cache, k, v, slots)
    expected = torch.zeros(shape)
    for t, slot in enumerate(slots.tolist()):
        expected[slot // 4, 0, slot % 4] = k[t]
        expected[slot // 4, 1, slot % 4] = v[t]
    assert torch.equal(cache, expected)


def test_write_kv_checks_shapes_and_dtype() -> None:
    cache = torch.zeros(kv_cache_shape(2, 4, 2, 3))
    slots = torch.tensor([1])
    with pytest.raises(ValueError, match="must be"):
        write_kv(cache, torch.zeros(1, 3, 3), torch.zeros(1, 3, 3), slots)
    with pytest.raises(TypeError, match="dtype"):
        write_kv(cache, torch.zeros(1, 2, 3, dtype=torch.bfloat16), torch.zeros(1, 2, 3, dtype=torch.bfloat16), slots)

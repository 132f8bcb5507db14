"""Block bytes round-trip exactly, in the documented layout, for every dtype."""

from __future__ import annotations

import pytest
import torch

from kvcache.kv_bytes import bytes_per_block, read_blocks, write_blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_to_other_block_ids(dtype):
    src = torch.randn(3, 10, 2, 4, 2, 8).to(dtype)
    dst = torch.zeros_like(src)
    payload = read_blocks(src, [7, 2, 5])
    assert len(payload) == 3 * bytes_per_block(src) == 3 * 3 * 2 * 4 * 2 * 8 * src.element_size()
    write_blocks(dst, [0, 9, 4], payload)
    assert torch.equal(dst[:, 0], src[:, 7]) and torch.equal(dst[:, 9], src[:, 2]) and torch.equal(dst[:, 4], src[:, 5])
    untouched = [b for b in range(10) if b not in (0, 9, 4)]
    assert not dst[:, untouched].any()


def test_layout_is_layer_major_k_then_v_per_block():
    cache = torch.arange(2 * 3 * 2 * 2 * 1 * 1, dtype=torch.float32).view(2, 3, 2, 2, 1, 1)
    values = torch.frombuffer(bytearray(read_blocks(cache, [1])), dtype=torch.float32).tolist()
    assert values == cache[:, 1].flatten().tolist()  # layer 0 K, layer 0 V, layer 1 K, layer 1 V


def test_wrong_length_is_refused_and_changes_nothing():
    cache = torch.zeros(1, 4, 2, 2, 1, 2)
    with pytest.raises(ValueError, match="expected"):
        write_blocks(cache, [1, 2], b"\x00" * (bytes_per_block(cache) * 2 - 1))
    assert not cache.any()


def test_a_pool_without_layers_has_blocks_of_no_bytes():
    """A model without KV (a pure state-space one): its blocks only count tokens; they read and write as nothing, and
    a payload of any bytes is still refused."""
    cache = torch.zeros(0, 4, 2, 16, 1, 2)
    assert bytes_per_block(cache) == 0 and read_blocks(cache, [0, 3]) == b""
    write_blocks(cache, [0, 3], b"")
    with pytest.raises(ValueError, match="expected 0"):
        write_blocks(cache, [1], b"\x00")

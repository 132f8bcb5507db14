"""KV blocks ↔ raw bytes, the payload format of the KV stream and the cache-store.

A block's bytes are, for each layer in order, its K then its V, each a C-order
``[block_size, num_kv_heads, head_dim]`` array: the slice ``kv_cache[:, block]`` of a
``[num_layers, num_blocks, 2, block_size, num_kv_heads, head_dim]`` cache (see ``KVLayout`` in
``protos/pdserve/v1/node.proto``). One of the few torch modules of this package.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def bytes_per_block(kv_cache: torch.Tensor) -> int:
    num_layers, _, *block_shape = kv_cache.shape
    return num_layers * kv_cache.element_size() * int(torch.Size(block_shape).numel())


def read_blocks(kv_cache: torch.Tensor, block_ids: Sequence[int]) -> bytes:
    """The bytes of ``block_ids``, concatenated in that order."""
    index = torch.tensor(list(block_ids), dtype=torch.long, device=kv_cache.device)
    blocks = kv_cache.index_select(1, index).transpose(0, 1).contiguous()
    return blocks.view(torch.uint8).cpu().numpy().tobytes()


def write_blocks(kv_cache: torch.Tensor, block_ids: Sequence[int], payload: bytes | memoryview) -> None:
    """Store ``payload`` (as :func:`read_blocks` makes it) into ``block_ids``. Raises ``ValueError`` if its
    length is not exactly ``len(block_ids)`` blocks."""
    expected = bytes_per_block(kv_cache) * len(block_ids)
    if len(payload) != expected:
        raise ValueError(f"payload of {len(payload)} bytes for {len(block_ids)} blocks, expected {expected}")
    if not expected:  # no blocks, or blocks of no bytes (a model without KV)
        return
    num_layers, _, *block_shape = kv_cache.shape
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(kv_cache.dtype)
    data = data.view(len(block_ids), num_layers, *block_shape).transpose(0, 1).to(kv_cache.device)
    index = torch.tensor(list(block_ids), dtype=torch.long, device=kv_cache.device)
    kv_cache.index_copy_(1, index, data)

"""The layout of an engine's KV cache, as a peer or a store must know it to use the engine's blocks.

The engine describes itself with this plain value (:meth:`LLMEngine.kv_layout_spec`); the node side puts it
on the wire (``services.engine_node.kv_layout``: the ``pdserve.v1.KVLayout`` proto and its ``layout_id``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayoutSpec:
    dtype: str  # the engine's dtype setting: "bfloat16", "float32", "float16"
    block_size: int  # tokens per block
    num_layers: int
    num_kv_heads: int
    head_dim: int
    model_fingerprint: bytes  # kvcache.hashing.model_fingerprint: the prefix of every cache-store key
    bytes_per_block: int  # one block's KV over all layers, in wire order (kvcache.kv_bytes)

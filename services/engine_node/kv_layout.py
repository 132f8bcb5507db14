"""The ``pdserve.v1.KVLayout`` of an engine's KV cache: what a peer must match to use its blocks."""

from __future__ import annotations

import hashlib

from pdserve.v1 import node_pb2

from services.engine.kv_layout_spec import KVLayoutSpec


def layout_id(layout: node_pb2.KVLayout) -> str:
    """A short digest of ``layout``: two engines' KV is interchangeable exactly when their ids are equal."""
    return hashlib.blake2b(layout.SerializeToString(deterministic=True), digest_size=8).hexdigest()


def kv_layout(spec: KVLayoutSpec) -> node_pb2.KVLayout:
    """The proto of a layout (an engine's: :meth:`LLMEngine.kv_layout_spec`, no engine lock needed). Node
    logic holds the ``KVLayoutSpec``; the proto is made where it goes on the wire."""
    return node_pb2.KVLayout(
        dtype=spec.dtype, block_size=spec.block_size, num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, model_fingerprint=spec.model_fingerprint, bytes_per_block=spec.bytes_per_block,
    )


def layout_from_proto(message: node_pb2.KVLayout) -> KVLayoutSpec:
    """A layout that came over the wire, as the engine describes its own."""
    return KVLayoutSpec(dtype=message.dtype, block_size=message.block_size, num_layers=message.num_layers,
                        num_kv_heads=message.num_kv_heads, head_dim=message.head_dim,
                        model_fingerprint=message.model_fingerprint, bytes_per_block=message.bytes_per_block)

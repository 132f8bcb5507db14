"""The ``pdserve.v1.KVLayout`` of an engine's KV cache: what a peer must match to use its blocks."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from pdserve.v1 import node_pb2

from services.engine.kv_layout_spec import KVLayoutSpec

if TYPE_CHECKING:
    from services.engine.engine import LLMEngine


def layout_id(layout: node_pb2.KVLayout) -> str:
    """A short digest of ``layout``: two engines' KV is interchangeable exactly when their ids are equal."""
    return hashlib.blake2b(layout.SerializeToString(deterministic=True), digest_size=8).hexdigest()


def kv_layout(source: KVLayoutSpec | LLMEngine) -> node_pb2.KVLayout:
    """The proto of a layout, or of an engine's (:meth:`LLMEngine.kv_layout_spec`: no engine lock needed)."""
    spec = source if isinstance(source, KVLayoutSpec) else source.kv_layout_spec()
    return node_pb2.KVLayout(
        dtype=spec.dtype, block_size=spec.block_size, num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, model_fingerprint=spec.model_fingerprint, bytes_per_block=spec.bytes_per_block,
    )

"""The ``pdserve.v1.KVLayout`` of an engine's KV cache: what a peer must match to use its blocks."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from pdserve.v1 import node_pb2

from kvcache.kv_bytes import bytes_per_block

if TYPE_CHECKING:
    from services.engine.engine import LLMEngine


def layout_id(layout: node_pb2.KVLayout) -> str:
    """A short digest of ``layout``: two engines' KV is interchangeable exactly when their ids are equal."""
    return hashlib.blake2b(layout.SerializeToString(deterministic=True), digest_size=8).hexdigest()


def kv_layout(engine: LLMEngine) -> node_pb2.KVLayout:
    cfg = engine.model.config
    return node_pb2.KVLayout(
        dtype=engine.config.dtype, block_size=engine.kv.block_size, num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, model_fingerprint=engine.fingerprint,
        bytes_per_block=bytes_per_block(engine.runner.kv_cache),
    )

"""Cache-store keys: ``model fingerprint (16 bytes) ‖ block id (16 bytes)``.

The block id is normally the block's chained hash (:mod:`kvcache.hashing`), which already names the same
KV on every node; the fingerprint prefix lets the store tell whose KV a key is, so a node serving another
model or dtype is refused rather than served foreign bytes. The engine builds keys with these (its KV
offload, its output cache); the cache-store checks them (``services.cache_store.keys``).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvcache.hashing import DIGEST_SIZE

FINGERPRINT_BYTES = DIGEST_SIZE
BLOCK_ID_BYTES = DIGEST_SIZE
KEY_BYTES = FINGERPRINT_BYTES + BLOCK_ID_BYTES


def store_key(fingerprint: bytes, block_id: bytes) -> bytes:
    assert len(fingerprint) == FINGERPRINT_BYTES, f"fingerprint must be {FINGERPRINT_BYTES} bytes"
    assert len(block_id) == BLOCK_ID_BYTES, f"block id must be {BLOCK_ID_BYTES} bytes"
    return fingerprint + block_id


def store_keys(fingerprint: bytes, block_ids: Iterable[bytes]) -> list[bytes]:
    return [store_key(fingerprint, block_id) for block_id in block_ids]


def fingerprint_of(key: bytes) -> bytes:
    return key[:FINGERPRINT_BYTES]

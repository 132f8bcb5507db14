"""Cache-store keys: ``model fingerprint (16 bytes) ‖ block id (16 bytes)``, and the checks of a call's keys.

The block id is normally the block's chained hash (:mod:`kvcache.hashing`), which already names the same
KV on every node; the fingerprint prefix lets the store tell whose KV a key is, so a node serving another
model or dtype is refused rather than served foreign bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvcache.hashing import DIGEST_SIZE
from services.cache_store.errors import InvalidKeyError

FINGERPRINT_BYTES = DIGEST_SIZE
BLOCK_ID_BYTES = DIGEST_SIZE
KEY_BYTES = FINGERPRINT_BYTES + BLOCK_ID_BYTES
# keys in one Get, Lookup or Delete: 1M tokens at 16 a block (the bundled model's context is 512 blocks); without
# a bound, a call of a million keys held the event loop for ~0.4 s while they were read and checked
MAX_KEYS_PER_CALL = 65536


def store_key(fingerprint: bytes, block_id: bytes) -> bytes:
    assert len(fingerprint) == FINGERPRINT_BYTES, f"fingerprint must be {FINGERPRINT_BYTES} bytes"
    assert len(block_id) == BLOCK_ID_BYTES, f"block id must be {BLOCK_ID_BYTES} bytes"
    return fingerprint + block_id


def store_keys(fingerprint: bytes, block_ids: Iterable[bytes]) -> list[bytes]:
    return [store_key(fingerprint, block_id) for block_id in block_ids]


def fingerprint_of(key: bytes) -> bytes:
    return key[:FINGERPRINT_BYTES]


def check_key_count(count: int) -> None:
    """``InvalidKeyError`` past :data:`MAX_KEYS_PER_CALL` (checked before the keys are read one by one)."""
    if count > MAX_KEYS_PER_CALL:
        raise InvalidKeyError("keys", f"at most {MAX_KEYS_PER_CALL} per call, got {count}")


def check_keys(keys: Sequence[bytes], fingerprint: bytes = b"") -> None:
    """``InvalidKeyError`` for more than :data:`MAX_KEYS_PER_CALL` keys, a key that is not 32 bytes or,
    when ``fingerprint`` is given, one that does not start with it."""
    check_key_count(len(keys))
    if fingerprint and len(fingerprint) != FINGERPRINT_BYTES:
        raise InvalidKeyError("model_fingerprint", f"must be {FINGERPRINT_BYTES} bytes, got {len(fingerprint)}")
    for i, key in enumerate(keys):
        if len(key) != KEY_BYTES:
            raise InvalidKeyError(f"keys[{i}]", f"must be {KEY_BYTES} bytes (model fingerprint ‖ block id), "
                                                f"got {len(key)}")
        if fingerprint and fingerprint_of(key) != fingerprint:
            raise InvalidKeyError(f"keys[{i}]", f"key for another model: it starts with {fingerprint_of(key).hex()}, "
                                                f"model_fingerprint is {fingerprint.hex()}")

"""Cache-store keys: ``model fingerprint (16 bytes) ‖ block id (16 bytes)``, and the checks of a call's keys.

The key scheme itself lives in :mod:`kvcache.store_keys` (the engine builds keys without importing the
cache-store); it is re-exported here with the checks the store makes of every call's keys.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcache.store_keys import BLOCK_ID_BYTES, FINGERPRINT_BYTES, KEY_BYTES, fingerprint_of, store_key, store_keys
from services.cache_store.errors import InvalidKeyError

__all__ = ["BLOCK_ID_BYTES", "FINGERPRINT_BYTES", "KEY_BYTES", "MAX_KEYS_PER_CALL", "check_key_count", "check_keys",
           "fingerprint_of", "store_key", "store_keys"]

# keys in one Get, Lookup or Delete: 1M tokens at 16 a block (the bundled model's context is 512 blocks); without
# a bound, a call of a million keys held the event loop for ~0.4 s while they were read and checked
MAX_KEYS_PER_CALL = 65536


def check_key_count(count: int) -> None:
    """``InvalidKeyError`` past :data:`MAX_KEYS_PER_CALL` (checked before the keys are read one by one)."""
    if count > MAX_KEYS_PER_CALL:
        raise InvalidKeyError("keys", f"at most {MAX_KEYS_PER_CALL} per call, got {count}")


def check_keys(keys: Sequence[bytes], fingerprint: bytes = b"") -> None:
    """``InvalidKeyError`` for more than :data:`MAX_KEYS_PER_CALL` keys, a key that is not 32 bytes,
    a key that comes twice or, when ``fingerprint`` is given, one that does not start with it.

    A repeated key is refused (``keys[i]: repeats keys[j]``): a Get would stream the block once per copy
    (one stored 4 MiB key named 2,000 times in a 68 KB request streamed 7.8 GiB) and a Lookup would count
    it as more prefix hits; no caller names a key twice (prefix keys are chained hashes, a request's own
    keys are random), so a Delete is held to the same rule."""
    check_key_count(len(keys))
    if fingerprint and len(fingerprint) != FINGERPRINT_BYTES:
        raise InvalidKeyError("model_fingerprint", f"must be {FINGERPRINT_BYTES} bytes, got {len(fingerprint)}")
    first: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        if len(key) != KEY_BYTES:
            raise InvalidKeyError(f"keys[{i}]", f"must be {KEY_BYTES} bytes (model fingerprint ‖ block id), "
                                                f"got {len(key)}")
        if fingerprint and fingerprint_of(key) != fingerprint:
            raise InvalidKeyError(f"keys[{i}]", f"key for another model: it starts with {fingerprint_of(key).hex()}, "
                                                f"model_fingerprint is {fingerprint.hex()}")
        j = first.setdefault(key, i)
        if j != i:
            raise InvalidKeyError(f"keys[{i}]", f"repeats keys[{j}] ({key.hex()}): a key may come once per call")

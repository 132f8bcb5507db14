"""Chained, process-stable keys of full KV blocks.

A full block's key is ``blake2b(parent key | root marker, model fingerprint, token ids as <u32)``, so the
same key names the same KV on the prefill node, the decode node and the cache-store. Python's ``hash()``
is salted per process and must never be used here.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence

BlockHash = bytes
"""16-byte chained key of one full block."""

DIGEST_SIZE = 16
ROOT_PARENT: BlockHash = bytes(DIGEST_SIZE)
"""Stands in for the parent key of a sequence's first block."""

_BLOCK_PERSON = b"pdserve.block.v1"  # blake2b personalisation: domain separation + scheme version
_MODEL_PERSON = b"pdserve.model.v1"


def model_fingerprint(**identity: object) -> bytes:
    """16-byte digest of everything that makes KV of one model incompatible with another's.

    Pass the identity fields as keywords (model, architecture, dtype, block_size, num_layers,
    num_kv_heads, head_dim, ...). They are rendered as sorted-key compact JSON; values JSON cannot encode
    (a ``torch.dtype``, say) are rendered with ``str()``.
    """
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(canonical.encode(), digest_size=DIGEST_SIZE, person=_MODEL_PERSON).digest()


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], fingerprint: bytes) -> BlockHash:
    """Key of one FULL block whose predecessor has key ``parent`` (None for the first block)."""
    parent = ROOT_PARENT if parent is None else parent
    assert len(parent) == DIGEST_SIZE, f"parent key must be {DIGEST_SIZE} bytes, got {len(parent)}"
    assert len(fingerprint) == DIGEST_SIZE, f"fingerprint must be {DIGEST_SIZE} bytes, got {len(fingerprint)}"
    digest = hashlib.blake2b(parent, digest_size=DIGEST_SIZE, person=_BLOCK_PERSON)
    digest.update(fingerprint)
    digest.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return digest.digest()


def hash_token_blocks(
    token_ids: Sequence[int],
    block_size: int,
    fingerprint: bytes,
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Chained keys of every full block of ``token_ids``; a trailing partial block gets no key."""
    assert block_size > 0, f"block_size must be positive, got {block_size}"
    keys: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], fingerprint)
        keys.append(parent)
    return keys

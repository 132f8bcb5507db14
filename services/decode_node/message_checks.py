"""Field checks of the decode node's messages, run before anything is reserved, marked or written.

The messages are the protos of ``decode.proto`` (read as plain objects: protos stop at the servicer).
Whoever sends them (a buggy or hostile peer included), a malformed field is refused with
``INVALID_ARGUMENT`` naming it. Checks that need engine facts (token ids against the vocabulary, the
prompt's length at commit, block ids against the grant) run on the engine thread, in
``services/engine/decode_role.py`` and ``reservations.py``, before those calls change anything.
"""

from __future__ import annotations

from typing import Any

from kvcache.store_keys import KEY_BYTES, fingerprint_of
from services.common.errors import InvalidArgumentError
from services.common.field_checks import check_addresses, check_request_id

MAX_BLOCK_HASH_BYTES = 64  # the chained hashes are 16 bytes; anything far past that is not one


def check_reserve(request: Any, block_size: int, now_unix_ms: int) -> None:
    """After the layout check: ``block_size`` is the sender's (= this node's), 0 when it sent no layout
    (then the hashes' count is not checked: they are the sender's blocks, of a size not known here).
    A ``deadline_unix_ms`` already past (on this node's clock) is refused: the request could only be
    aborted here. ``lease_ms`` is not refused: over this node's ``--lease-ms`` it is clamped to it (the
    grant says the lease it got), so no caller holds blocks longer without traffic than the node allows."""
    check_request_id(request.request_id)
    check_addresses(request.decode_peers, "decode_peers")
    if request.deadline_unix_ms < 0:
        raise InvalidArgumentError("deadline_unix_ms", f"is {request.deadline_unix_ms}: 0 (none) or a time")
    if 0 < request.deadline_unix_ms <= now_unix_ms:
        raise InvalidArgumentError("deadline_unix_ms", f"is {now_unix_ms - request.deadline_unix_ms} ms in the "
                                                       f"past: the request's deadline passed")
    full_blocks = len(request.prompt_token_ids) // block_size if block_size else len(request.prompt_token_ids)
    if len(request.block_hashes) > full_blocks:
        raise InvalidArgumentError("block_hashes", f"{len(request.block_hashes)} hashes for a prompt of "
                                                   f"{full_blocks} full blocks")
    for i, block_hash in enumerate(request.block_hashes):
        if len(block_hash) > MAX_BLOCK_HASH_BYTES:
            raise InvalidArgumentError(f"block_hashes[{i}]", f"is {len(block_hash)} bytes, at most "
                                                             f"{MAX_BLOCK_HASH_BYTES}")


def check_batch(batch: Any, bytes_per_block: int) -> None:
    """A batch of bytes (``payload``) or of source block ids (CUDA IPC): at least one block, no block
    twice, ``payload`` exactly one block's bytes per block id."""
    ids = batch.block_ids
    if not ids:
        raise InvalidArgumentError("blocks.block_ids", "is empty")
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError("blocks.block_ids", "names a block twice")
    if batch.source_block_ids:
        if batch.payload or len(batch.source_block_ids) != len(ids):
            raise InvalidArgumentError("blocks", "source_block_ids come without payload, one per block id")
        return
    if len(batch.payload) != len(ids) * bytes_per_block:
        raise InvalidArgumentError("blocks.payload", f"{len(batch.payload)} bytes for {len(ids)} blocks, expected "
                                                     f"{len(ids) * bytes_per_block} ({bytes_per_block} per block)")


def check_adopt(request: Any, fingerprint: bytes) -> None:
    """The id, the addresses and the keys' form (each ``KEY_BYTES``, of this node's model); the token ids,
    lengths and key count are checked against the engine's vocabulary and block size by the engine."""
    check_request_id(request.request_id)
    check_addresses(request.decode_peers, "decode_peers")
    if request.cache_store:
        check_addresses([request.cache_store], "cache_store")
    elif request.kv_keys:
        raise InvalidArgumentError("cache_store", "is required to fetch kv_keys")
    if len(request.from_node) > 256 or not request.from_node.isprintable():
        raise InvalidArgumentError("from_node", "is not at most 256 printable characters")
    for i, key in enumerate(request.kv_keys):
        if len(key) != KEY_BYTES:
            raise InvalidArgumentError(f"kv_keys[{i}]", f"must be {KEY_BYTES} bytes, got {len(key)}")
        if fingerprint_of(key) != fingerprint:
            raise InvalidArgumentError(f"kv_keys[{i}]", "is a key of another model")

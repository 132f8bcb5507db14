"""Prompt blocks whose KV comes from outside the engine (a prefill node's cache-store): claimed, written
by the caller, then published as prefix hits (``PrefillRole.claim_prefix_blocks`` and the calls after it).

A claim's blocks are owned in the KV manager by a hold of the request (:func:`hold_id`), so nothing can
evict them between the claim and the request's own admission, which finds them as prefix hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcache.manager import KVCacheManager


@dataclass(frozen=True)
class PrefixClaim:
    """Blocks ``first_block .. end_block`` of the prompt, allocated under the hold ``owner``, to be written
    (``block_ids``: their ids in the pool, in prompt order)."""

    owner: str
    first_block: int
    end_block: int
    block_ids: list[int]


def hold_id(request_id: str) -> str:
    """The KV manager owner of a request's claimed blocks."""
    return f"{request_id}#store"


def claim(kv: KVCacheManager, request_id: str, prompt_ids: Sequence[int], first_block: int,
          end_block: int) -> PrefixClaim | None:
    """Allocate the blocks of ``first_block .. end_block`` that are still needed (see
    ``PrefillRole.claim_prefix_blocks``)."""
    match = kv.match_prefix(prompt_ids)
    start = match.num_blocks
    if start >= end_block or start < first_block:
        return None
    owner = hold_id(request_id)
    if kv.has_request(owner) or kv.allocate(owner, end_block * kv.block_size, match) is None:
        return None
    return PrefixClaim(owner, start, end_block, kv.block_ids(owner)[start:])


def release(kv: KVCacheManager, request_id: str) -> None:
    """Free the request's hold, if any (published blocks stay cached, unpublished ones go back free)."""
    owner = hold_id(request_id)
    if kv.has_request(owner):
        kv.free(owner)

"""Named errors of the KV-cache control plane.

An expected shortage (not enough free blocks) is never an error: it returns a sentinel (``None`` /
``False``). These exceptions mean the caller misused the API; servicers map them to gRPC statuses.
"""

from __future__ import annotations


class KVCacheError(Exception):
    """Base class of every kvcache misuse error."""


class UnknownRequestError(KVCacheError):
    """The request id has no block table (never allocated, or already freed)."""


class BlockStateError(KVCacheError):
    """A block operation does not fit the block's state (e.g. caching a free block)."""


class DoubleFreeError(BlockStateError):
    """A block was freed more times than it is referenced."""


class BlockTableError(KVCacheError):
    """A request's block table was misused (prefix on a grown table, computing past capacity, ...)."""


class StalePrefixError(KVCacheError):
    """A PrefixMatch no longer describes the prefix index (a hit block was evicted meanwhile).

    Match and allocate in the same scheduling step, with no pool mutation in between.
    """

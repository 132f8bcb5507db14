"""KV-cache control plane: block pool, free queue, chained block hashes, prefix index, block tables.

Plain Python (no torch, no gRPC); the engine scheduler uses ``KVCacheManager``.
"""

from kvcache.block_pool import BlockPool
from kvcache.errors import (
    BlockStateError,
    BlockTableError,
    DoubleFreeError,
    KVCacheError,
    StalePrefixError,
    UnknownRequestError,
)
from kvcache.hashing import BlockHash, hash_block, hash_token_blocks, model_fingerprint
from kvcache.manager import KVCacheManager, PrefixMatch

__all__ = [
    "BlockHash",
    "BlockPool",
    "BlockStateError",
    "BlockTableError",
    "DoubleFreeError",
    "KVCacheError",
    "KVCacheManager",
    "PrefixMatch",
    "StalePrefixError",
    "UnknownRequestError",
    "hash_block",
    "hash_token_blocks",
    "model_fingerprint",
]

"""Process-wide glibc malloc settings for processes that move KV blocks (the cache-store and the nodes).

Every received gRPC message and every block is a buffer of a few hundred KiB; by default glibc maps each
one afresh (``mmap``) and pays a page fault per 4 KiB touching it. Keeping them on the heap and reusing
freed ones took a cache-store Get from ~0.7 to ~1.2 GB/s on the client side (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_malloc() -> bool:
    """glibc only: serve block-sized buffers (each received message, each stored block) from the heap and
    keep freed ones for reuse, instead of an ``mmap`` (and a page fault per 4 KiB) for every message.
    Blocks are of one size per model, so the heap does not fragment. Returns whether it applied."""
    name = ctypes.util.find_library("c")
    if name is None or "libc.so" not in name:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20))

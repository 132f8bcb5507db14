"""A Get in progress: the blocks of a stored prefix, fetched one by one as the stream reaches them,
under a lease (:mod:`services.cache_store.leases`: it ends with the Get, or ``lease_s`` after the Get
began at the latest; serving blocks does not renew it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from services.cache_store.block import StoredBlock
from services.cache_store.errors import MissingBlockError
from services.cache_store.leases import Lease

if TYPE_CHECKING:
    from services.cache_store.store import BlockStore


class BlockReader:
    """A Get in progress: iterate for its blocks, in order; ``close`` (or ``with``) ends its lease.

    A block whose disk file turns out damaged or missing ends the iteration with ``allow_partial`` (the
    blocks before it are the stored prefix) and raises ``MissingBlockError`` without."""

    def __init__(self, store: BlockStore, keys: list[bytes], allow_partial: bool, lease: Lease,
                 restore: bool = False) -> None:
        self.store = store
        self.keys = keys
        self.allow_partial = allow_partial
        self.lease = lease
        self.restore = restore  # counted as restored blocks, not hits and misses
        self.served: list[bytes] = []

    def __iter__(self) -> Iterator[StoredBlock]:
        store = self.store
        for i, key in enumerate(self.keys):
            block = store.fetch(key, self.restore)
            if block is None:
                if not self.restore:
                    store.misses_total += len(self.keys) - i
                if self.allow_partial:
                    return
                raise MissingBlockError(f"keys[{i}] = {key.hex()} is no longer readable (its disk copy was "
                                        f"damaged or evicted)")
            self.served.append(key)
            yield block

    def close(self) -> None:
        self.store.leases.release(self.lease)
        self.store.memory.touch(self.served)

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

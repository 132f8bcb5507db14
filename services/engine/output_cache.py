"""Output caching: a finished request's full KV blocks (prompt and output) go to the cache-store under their
content keys, ``store_key(fingerprint, chained block hash)``, so a prefill node finds them on the next
turn of the conversation (its prompt starts with this one's prompt and output).

:meth:`OutputCache.capture` runs on the engine thread right after the request finished: its blocks were
just freed into the prefix index, where every full block whose KV was computed is findable by its hash,
and nothing has been allocated since. It copies their bytes out there (``read_blocks``) and a background
thread puts them; the engine step never waits for the cache-store. Puts past ``max_inflight_bytes`` are
dropped (counted). Only requests that finished normally (stop, length) are cached. Puts go to a
:class:`~services.engine.remote_store.RemoteBlockStore` of their own, with its own breaker (a slow put of
this best-effort cache does not make the KV offload give up its copies): while the store is not
available, nothing is copied out and the request counts as failed.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import structlog
import torch

from kvcache.kv_bytes import read_blocks
from kvcache.manager import KVCacheManager
from kvcache.store_keys import store_key
from services.engine.remote_store import RemoteBlockStore
from services.engine.request import Request, RequestStatus

log = structlog.get_logger(__name__)
CACHED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


@dataclass
class OutputCacheStats:
    written_blocks_total: int = 0
    dropped_total: int = 0  # requests not cached: too many bytes in flight
    failed_total: int = 0  # puts the cache-store refused or did not answer


class OutputCache:
    def __init__(self, remote: RemoteBlockStore, fingerprint: bytes, bytes_per_block: int,
                 max_inflight_bytes: int = 256 << 20):
        self.remote = remote
        self.fingerprint = fingerprint
        self.bytes_per_block = bytes_per_block
        self.max_inflight_bytes = max_inflight_bytes
        self._stats = OutputCacheStats()
        self._inflight: list[tuple[Future, int, str]] = []  # (put, number of blocks, request id)
        self._io = ThreadPoolExecutor(1, thread_name_prefix="output-cache")

    @property
    def stats(self) -> OutputCacheStats:
        self._collect()
        return self._stats

    @property
    def inflight_bytes(self) -> int:
        self._collect()
        return sum(n for _, n, _ in self._inflight) * self.bytes_per_block

    def capture(self, request: Request, kv: KVCacheManager, kv_cache: torch.Tensor) -> Future | None:
        """Copy out the finished request's full computed blocks and put them in the background."""
        if request.status not in CACHED:
            return None
        match = kv.match_prefix(request.token_ids[: request.num_computed_tokens + 1])
        if not match.block_ids:
            return None
        if not self.remote.available():  # the store failed moments ago (logged by the node's breaker)
            self._stats.failed_total += 1
            return None
        if self.inflight_bytes + match.num_blocks * self.bytes_per_block > self.max_inflight_bytes:
            self._stats.dropped_total += 1
            return None
        data = read_blocks(kv_cache, match.block_ids)
        view, size = memoryview(data), self.bytes_per_block
        blocks = [(store_key(self.fingerprint, h), view[i * size:(i + 1) * size])
                  for i, h in enumerate(match.block_hashes)]
        put = self._io.submit(self.remote.put, blocks)
        self._inflight.append((put, len(blocks), request.request_id))
        return put

    def _collect(self) -> None:
        """Account for the puts that ended (engine thread: the counters have one writer)."""
        pending = []
        for put, num_blocks, request_id in self._inflight:
            if not put.done():
                pending.append((put, num_blocks, request_id))
            elif put.exception() is not None:
                self._stats.failed_total += 1
                log.warning("output cache write failed", request_id=request_id, error=repr(put.exception()))
            else:
                self._stats.written_blocks_total += num_blocks
        self._inflight = pending

    def close(self) -> None:
        self._io.shutdown(wait=False)

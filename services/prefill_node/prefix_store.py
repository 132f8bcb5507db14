"""The prefill node's use of the cache-store: prompt blocks fetched instead of recomputed, and computed
blocks written back for the other prefill nodes.

Per request, before it is queued in the engine (``PrefillNode.prefill``):

1. :meth:`PrefixStore.fetch` — after the local prefix match, look the prompt's remaining full blocks up
   in the cache-store (keys: model fingerprint ‖ chained block hash, ``services.cache_store.keys``) and
   get the longest stored run. Runs concurrently with the reservation on a decode node. Any store
   failure is logged and counted, never the request's failure: the blocks are then computed.
2. :func:`import_fetched` — the fetched KV goes into blocks claimed for the request
   (``LLMEngine.claim_prefix_blocks``, ``services/engine/prefix_claims.py``) under the engine lock,
   written outside it, then published in the prefix index (``LLMEngine.publish_prefix_claim``), so the
   request's own admission finds them as prefix hits (its ``cached_tokens`` counts them) and nothing can
   evict them before it runs. The claim is freed when the request ends here (the blocks stay cached).
3. :meth:`PrefixStore.write_back` — when the request ends here, the full prompt blocks it computed are
   read out (``LLMEngine.end_prefill``, before they can be reused) and put in the background, with a cap on the
   bytes in flight (past it a write-back is dropped and counted). Off with ``--no-cache-store-write-through``.

Every call goes through a :class:`~services.cache_store.breaker.StoreBreaker`: once one times out or cannot
reach the store, fetches are skipped (the prompt is computed) and write-backs dropped for its cooldown,
instead of every prompt waiting out the lookup's timeout while the store hangs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc.aio
import structlog

from services.cache_store.breaker import StoreBreaker, StoreUnavailable, describe
from services.cache_store.client import AsyncCacheStoreClient
from services.cache_store.errors import CorruptBlockError
from services.cache_store.keys import store_keys
from services.common import tracing
from services.common.cancellation import uncancellable
from services.engine.engine import LLMEngine
from services.engine_node.worker import EngineWorker

log = structlog.get_logger(__name__)


@dataclass
class PrefixStoreStats:
    hit_tokens_total: int = 0  # prompt tokens whose KV came from the store (imported into the local cache)
    fetched_bytes_total: int = 0
    written_blocks_total: int = 0
    written_bytes_total: int = 0
    writebacks_dropped_total: int = 0  # over the in-flight cap, or the store failed moments ago
    errors_total: int = 0  # lookups, gets or puts that failed (the request went on without them)


@dataclass(frozen=True)
class FetchedBlocks:
    """KV of prompt blocks ``first_block ..`` (prompt order) as the store returned it, one payload each."""

    first_block: int
    payloads: list[bytes]

    @property
    def end_block(self) -> int:
        return self.first_block + len(self.payloads)


def fetchable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Full prompt blocks that may come from a cache: at least one prompt token is always computed."""
    return max(0, (num_prompt_tokens - 1) // block_size)


class PrefixStore:
    def __init__(self, client: AsyncCacheStoreClient, write_through: bool = True,
                 writeback_max_bytes: int = 256 << 20, breaker: StoreBreaker | None = None):
        layout = client.layout
        assert layout is not None, "the prefix store needs the node's KV layout"
        self.client = client
        self.fingerprint = layout.model_fingerprint
        self.block_size = layout.block_size
        self.bytes_per_block = layout.bytes_per_block
        self.write_through = write_through
        self.writeback_max_bytes = writeback_max_bytes
        self.writeback_bytes_in_flight = 0
        self.stats = PrefixStoreStats()
        self.breaker = breaker or StoreBreaker()
        self._tasks: set[asyncio.Task[None]] = set()

    async def fetch(self, request_id: str, num_prompt_tokens: int, block_hashes: list[bytes],
                    local_blocks: int) -> FetchedBlocks | None:
        """The stored run of the prompt's blocks right after the ``local_blocks`` cached here, or None.
        ``block_hashes``: the chained hashes of the prompt's full blocks (``KVCacheManager.hash_blocks``)."""
        wanted = fetchable_blocks(num_prompt_tokens, self.block_size)
        if local_blocks >= wanted or self.breaker.is_open():  # open: the store failed moments ago (logged)
            return None
        keys = store_keys(self.fingerprint, block_hashes[local_blocks:wanted])
        with tracing.span("cache_store.fetch", blocks=len(keys)) as fetching:
            try:
                hits = await self.breaker.call_async(self.client.lookup, keys)
                fetching.set_attribute("pdserve.hit_blocks", hits)
                if hits == 0:
                    return None
                payloads = await self.breaker.call_async(self.client.get, keys[:hits], allow_partial=True)
            except StoreUnavailable:  # another call is testing whether the store answers again
                return None
            except (grpc.aio.AioRpcError, CorruptBlockError) as error:
                self.stats.errors_total += 1
                log.warning("cache-store fetch failed; computing the prompt", request_id=request_id,
                            error=describe(error))
                tracing.fail(fetching, describe(error))
                return None
        if not payloads:
            return None
        self.stats.fetched_bytes_total += sum(len(p) for p in payloads)
        return FetchedBlocks(local_blocks, payloads)

    def count_import(self, num_blocks: int) -> None:
        self.stats.hit_tokens_total += num_blocks * self.block_size

    def write_back(self, request_id: str, block_hashes: list[bytes], first_block: int, payload: bytes) -> None:
        """Put prompt blocks ``first_block ..`` (``payload``: their KV, concatenated) in the background."""
        if not payload or not self.write_through:
            return
        if self.writeback_bytes_in_flight + len(payload) > self.writeback_max_bytes or self.breaker.is_open():
            self.stats.writebacks_dropped_total += 1
            return
        size = self.bytes_per_block
        keys = store_keys(self.fingerprint, block_hashes[first_block:first_block + len(payload) // size])
        view = memoryview(payload)
        blocks = [(key, view[i * size:(i + 1) * size]) for i, key in enumerate(keys)]
        self.writeback_bytes_in_flight += len(payload)
        task = asyncio.create_task(self._put(request_id, blocks, len(payload)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _put(self, request_id: str, blocks: list[tuple[bytes, memoryview]], size: int) -> None:
        try:
            with tracing.span("cache_store.write_back", blocks=len(blocks)):
                await self.breaker.call_async(self.client.put, blocks)
            self.stats.written_blocks_total += len(blocks)
            self.stats.written_bytes_total += size
        except StoreUnavailable:
            self.stats.writebacks_dropped_total += 1
        except grpc.aio.AioRpcError as error:
            self.stats.errors_total += 1
            log.warning("cache-store write-back failed", request_id=request_id, error=describe(error))
        finally:
            self.writeback_bytes_in_flight -= size

    async def close(self) -> None:
        """Let pending write-backs finish (they are short), then close the channel."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10.0)
        await self.client.close()


async def import_fetched(worker: EngineWorker, store: PrefixStore, request_id: str, prompt_ids: list[int],
                         fetched: FetchedBlocks | None) -> None:
    """Put fetched prefix blocks into the node's cache (held for the request) before it is queued."""
    if fetched is None:
        return
    claim = await worker.call(LLMEngine.claim_prefix_blocks, request_id, prompt_ids, fetched.first_block,
                              fetched.end_block)
    if claim is None:
        return
    payload = b"".join(fetched.payloads[claim.first_block - fetched.first_block:])
    write = asyncio.get_running_loop().run_in_executor(None, worker.engine.write_kv_blocks, claim.block_ids,
                                                       payload)  # the claim holds these blocks: no lock
    try:
        await asyncio.shield(write)
    except asyncio.CancelledError:
        await uncancellable(asyncio.wait([write]))  # the claim is freed only once no thread writes its blocks
        raise
    except ValueError as error:  # the store's blocks do not fit this layout: compute instead
        log.warning("cache-store blocks rejected", request_id=request_id, error=str(error))
        await worker.call(LLMEngine.release_prefix_claim, request_id)
        return
    await worker.call(LLMEngine.publish_prefix_claim, claim, prompt_ids)
    store.count_import(claim.end_block - claim.first_block)

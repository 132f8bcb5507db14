"""The prefill node's logic: reserve on a decode node, prefill in chunks, stream the KV, commit.

Per request (``prefill``): validate → reserve on one of the decode candidates, waiting in that node's
queue while it refuses (``prepare.py``; none by the deadline → ``RESOURCE_EXHAUSTED``) → open a
``TransferKV`` stream to the granted node → queue the prompt in the engine as prefill-only → after every
engine step the blocks that became complete are read out on the engine thread and sent (1–4 MiB messages;
acknowledgements are read concurrently) → when the first token is sampled, the last blocks go out and
``KVCommit`` follows → once the commit is acknowledged the blocks are released here (they stay in this
node's prefix cache). Cancellation or any failure aborts the request here and on the decode node.

Engine failure (an exception escaped the engine thread): :meth:`PrefillNode.fail_all` ends every request
(waiting for a decode node, its first token or its blocks) with ``UNAVAILABLE`` naming the failure; their
reservations on decode nodes are left to the gateway's abort and the lease; ``on_engine_failure`` (set by
``serve.py``: health, exit) is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from services.common import tracing
from services.common.cancellation import uncancellable
from services.common.drain import drain_requests
from services.common.errors import UnavailableError
from services.common.kv_transfer_stats import KVTransferStats
from services.engine.engine import LLMEngine
from services.engine.errors import EngineStoppedError
from services.engine.prefill_role import FirstToken, HandoffPlan, ReadyBlocks
from services.engine.sampling_params import SamplingParams
from services.engine_node.kv_ipc_wire import IpcAnswer, IpcOffer
from services.engine_node.step_spans import RequestTrace
from services.engine_node.worker import EngineWorker
from services.prefill_node.decode_client import DecodeClients, Grant, ReserveAsk, granted_lease_s
from services.prefill_node.kv_ipc import IpcLinks, PoolExport, export_pool
from services.prefill_node.kv_sender import IpcRoute, KVSender
from services.prefill_node.live_requests import LiveRequest, LiveRequests
from services.prefill_node.prefix_store import FetchedBlocks, PrefixStore, import_fetched
from services.prefill_node.prepare import PrepareQueues, Refused, Reservation

log = structlog.get_logger(__name__)
MAX_MESSAGE_PAYLOAD = 4 << 20


@dataclass(frozen=True)
class Reserved:
    decode_address: str
    num_cached_blocks: int
    lease_deadline_unix_ms: int


@dataclass(frozen=True)
class Done:
    num_computed_tokens: int
    kv_bytes_sent: int
    kv_blocks_sent: int


PrefillEvent = Refused | Reserved | FirstToken | Done
Handoffs = asyncio.Queue[FirstToken | ReadyBlocks]  # one request's items from the engine thread


class PrefillNode:
    def __init__(self, engine: LLMEngine, lease_ms: int = 10_000, num_threads: int | None = None,
                 prepare: PrepareQueues | None = None, prefix_store: PrefixStore | None = None,
                 kv_ipc: bool = False):
        """``kv_ipc``: offer this node's KV pool by CUDA IPC to decode nodes on the same host and GPU
        (``kv_ipc.py``; a CPU pool never does), bytes for the others."""
        self.engine = engine
        self.prepare = prepare or PrepareQueues()
        self.prefix_store = prefix_store
        self.lease_ms = lease_ms
        self.layout = engine.kv_layout_spec()
        self.decode = DecodeClients(self.layout)  # decode nodes come and go (DNS discovery)
        self.handoffs: dict[str, Handoffs] = {}  # admitted requests' queues (event loop only)
        self.worker = EngineWorker(engine, self._deliver, on_step=LLMEngine.handoff_progress,
                                   num_threads=num_threads, on_failure=self._engine_failed)
        self.failure = ""  # why this node failed (its engine thread): every request ends with it
        self.on_engine_failure: Callable[[str], None] | None = None  # told the failure (serve.py)
        self._failing: asyncio.Task[None] | None = None
        self.preparing = 0  # requests looking for a decode node (the servicer counts them as waiting)
        self.live = LiveRequests()
        self.kv_sent = KVTransferStats()
        self.draining = False
        # a model without KV (a pure state-space one) has no pool bytes to share: its blocks go as empty batches
        on_gpu = engine.kv_pool.device.type == "cuda" and engine.kv_pool.numel() > 0
        self.ipc_links = IpcLinks(self._export_pool, self._offer_ipc) if kv_ipc and on_gpu else None

    def start(self) -> None:
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()
        await self.prepare.close()
        if self.prefix_store is not None:
            await self.prefix_store.close()
        await self.decode.close()

    def _export_pool(self) -> PoolExport:
        return export_pool(self.engine.kv_pool, self.layout)  # links exist only for a CUDA pool

    async def _offer_ipc(self, address: str, offer: IpcOffer) -> IpcAnswer:
        return await self.decode.offer_ipc(address, offer)

    async def _ipc_route(self, address: str) -> IpcRoute | None:
        """How this request's blocks reach ``address`` by CUDA IPC, or None (bytes)."""
        links = self.ipc_links
        session = await links.session_for(address) if links is not None else None
        if session is None:
            return None
        # the request holds the blocks it sends: they are read without the engine lock
        return IpcRoute(session, self.engine.read_kv_blocks, lambda reason: links.fail(address, reason))

    def _deliver(self, items: list[FirstToken | ReadyBlocks]) -> None:
        for item in items:
            queue = self.handoffs.get(item.request_id)
            if queue is not None:  # else the request already left
                queue.put_nowait(item)

    # ---- one request ----------------------------------------------------------------------------
    async def prefill(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                      candidates: list[str], timeout_s: float | None) -> AsyncIterator[PrefillEvent]:
        """One request, registered by id from start to the end of its cleanup (``live_requests.py``)."""
        self.refuse_if_closed()
        live = await self.live.enter(request_id)
        try:
            async with contextlib.aclosing(self._prefill(live, request_id, prompt_ids, sampling, candidates,
                                                         timeout_s)) as events:
                async for event in events:
                    yield event
        except asyncio.CancelledError:
            if live.ended_by is None:
                raise
            raise UnavailableError(f"request {request_id!r} ended: {live.ended_by}") from None
        finally:
            try:  # a cancel that lands during this wait is raised after it: the request must leave anyway
                await uncancellable(self.prepare.settled(request_id))  # unseen grants' aborts, in the background
            finally:
                self.live.leave(request_id, live)

    def refuse_if_closed(self) -> None:
        """A node that failed or drains takes no new request (``UNAVAILABLE``: the gateway runs it elsewhere)."""
        if self.failure:
            raise UnavailableError(self.failure)
        if self.draining:
            raise UnavailableError("prefill node is draining")

    async def _prefill(self, live: LiveRequest, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                       candidates: list[str], timeout_s: float | None) -> AsyncIterator[PrefillEvent]:
        block_hashes = await self.worker.call(LLMEngine.check_prefill, prompt_ids, sampling)
        trace = tracing.current_context()  # the Prefill span: parent of this request's spans here
        # runs while a decode node is found; none for a request asking for prompt logprobs (it computes its
        # whole prompt: fetched blocks would only be held beside its own)
        fetch = None if sampling.prompt_logprobs is not None else await self._start_fetch(request_id, prompt_ids,
                                                                                           block_hashes)
        ask = ReserveAsk(request_id, prompt_ids, sampling, block_hashes, self.lease_ms, candidates)
        reservation = await self._reserve(live, ask, timeout_s, trace, fetch)
        address, grant = reservation.address, reservation.answer
        sender = self.decode.kv_sender(address, request_id, grant, self.kv_sent)
        finished = False
        why = "it ended the request before the commit"
        transfer = tracing.start_span("kv_transfer", trace, decode_node=address)  # the TransferKV stream
        try:  # from here on, however the request ends, the reservation is undone unless it was used
            for refusal in reservation.refusals:
                yield refusal
            yield Reserved(address, grant.num_cached_blocks, grant.lease_deadline_unix_ms)
            await self._open(sender, grant, transfer)
            if fetch is not None:
                await import_fetched(self.worker, self.prefix_store, request_id, prompt_ids, await fetch)
            queue = await self._admit(request_id, prompt_ids, sampling, grant.num_cached_blocks, trace,
                                      by_reference=sender.ipc is not None)
            first = await _first_token(queue, sender)
            if first.finish_reason is not None:  # the first token ended the request: D needs nothing
                await self.decode.abort(address, request_id, "the first token finished the request")
                finished = live.ending = True  # done here: a request reusing the id waits for the cleanup
                yield first
                return
            yield first
            await _commit(queue, sender, first, len(prompt_ids), trace)
            finished = live.ending = True
            yield Done(len(prompt_ids) - first.cached_tokens, sender.bytes_sent, sender.blocks_sent)
        except (asyncio.CancelledError, GeneratorExit):
            why = "its Prefill call was cancelled"
            raise
        except Exception as error:
            why = f"it failed: {error}"
            raise
        finally:
            live.ending = True  # an Abort from now on waits for this cleanup, and cannot cut it short
            if fetch is not None:
                fetch.cancel()
            tracing.end(transfer, "not committed" if not finished else "", bytes=sender.bytes_sent,
                        blocks=sender.blocks_sent)
            await uncancellable(self._clean_up(request_id, block_hashes, sender, None if finished else why,
                                               abort_decode=live.ended_by != DRAINING_QUEUED))

    async def _reserve(self, live: LiveRequest, ask: ReserveAsk, timeout_s: float | None, trace: Any,
                       fetch: asyncio.Task[FetchedBlocks | None] | None) -> Reservation[Grant]:
        """A decode node's grant for the request (``prepare.py``); on failure the fetch is cancelled."""
        self.preparing += 1
        try:
            with tracing.span("reserve", trace, candidates=len(ask.decode_peers)) as reserving:
                reservation = await self.prepare.reserve(
                    ask.request_id, ask.decode_peers, self.decode.reserve_call(ask),
                    lambda address: self.decode.abort(address, ask.request_id, "it gave up the reservation"),
                    timeout_s)
                reserving.set_attribute("pdserve.decode_node", reservation.address)
                return reservation
        except BaseException:
            live.ending = True
            if fetch is not None:
                fetch.cancel()
            raise
        finally:
            self.preparing -= 1

    async def _open(self, sender: KVSender, grant: Grant, transfer: Any) -> None:
        """Open the request's KV stream (by CUDA IPC where the decode node takes it) and keep its lease."""
        sender.ipc = await self._ipc_route(sender.address)
        await sender.open(metadata=tracing.outgoing(tracing.context_with(transfer)))
        sender.keep_alive(granted_lease_s(grant, self.lease_ms))

    async def _admit(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, skip_blocks: int,
                     trace: Any, by_reference: bool) -> Handoffs:
        """Queue the prompt in the engine; the queue that its first token and ready blocks arrive on."""
        queue = self.handoffs[request_id] = Handoffs()
        hook = RequestTrace(trace, time.time_ns()) if trace is not None else None  # queue, prefill_chunk spans
        await self.worker.call(LLMEngine.admit_prefill, request_id, prompt_ids, sampling,
                               HandoffPlan(skip_blocks, by_reference), hook)
        return queue

    async def _clean_up(self, request_id: str, block_hashes: list[bytes], sender: KVSender,
                        abort_reason: str | None, abort_decode: bool = True) -> None:
        """Close the KV stream, free what the request holds here (once the engine let it go), write its
        computed blocks back, and abort it on its decode node (``abort_reason``) unless it was committed."""
        await sender.close()
        store = self.prefix_store
        write_back = abort_reason is None and store is not None and store.write_through
        computed = await self.free_here(request_id, write_back)
        if computed is not None and store is not None:
            store.write_back(request_id, block_hashes, *computed)
        if abort_reason is not None and self.worker.failure is None and abort_decode:
            await self.decode.abort(sender.address, request_id, abort_reason)
        # After an engine failure the decode reservation is left to the gateway, which aborts every leg of
        # the failed attempt when it hears this node's UNAVAILABLE (and to the lease): aborted from here
        # first, the decode leg's stream would end before that, and the gateway would blame the decode
        # node and not retry the request on another prefill node. So is the reservation of a queued request
        # a drain ended (``abort_decode`` False): the gateway aborts it as it runs the request elsewhere.

    async def free_here(self, request_id: str, read_computed: bool = False) -> tuple[int, bytes] | None:
        """Free what the request holds here, once the engine let it go (``LLMEngine.end_prefill``; with
        ``read_computed``, the prompt blocks it computed, read out first), and forget its handoff queue."""
        try:
            computed = await self.worker.call(LLMEngine.end_prefill, request_id, read_computed)
            await self.worker.released(request_id)
        except EngineStoppedError:  # the engine failed (or stopped): nothing of it is used again
            computed = None
        finally:
            self.handoffs.pop(request_id, None)
        return computed

    # ---- the cache-store (prefix_store.py) ------------------------------------------------------
    async def _start_fetch(self, request_id: str, prompt_ids: list[int], block_hashes: list[bytes]
                           ) -> asyncio.Task[FetchedBlocks | None] | None:
        store = self.prefix_store
        if store is None:
            return None
        local = await self.worker.call(LLMEngine.cached_prefix_blocks, prompt_ids)
        return asyncio.create_task(store.fetch(request_id, len(prompt_ids), block_hashes, local),
                                   name=f"prefix-fetch:{request_id}")

    async def abort(self, request_id: str, reason: str | None = None) -> bool:
        """End the request (its call is cancelled, or fails with ``reason``) and answer once it is gone here
        and on its decode node."""
        ended = await self.live.end(request_id, reason)
        found = await self.worker.call(LLMEngine.abort_prefill, request_id)
        self.handoffs.pop(request_id, None)
        return found or ended

    def _engine_failed(self, error: BaseException) -> None:
        reason = f"the engine failed: {error!r}"
        self._failing = asyncio.ensure_future(self.fail_all(reason))
        if self.on_engine_failure is not None:
            self.on_engine_failure(reason)

    async def fail_all(self, reason: str) -> None:
        """This node cannot go on: every request in flight ends (its call fails ``UNAVAILABLE`` with
        ``reason``; its reservation on a decode node is left to the gateway's abort and the lease), and so
        does every later one."""
        self.failure = reason
        ids = self.live.ids()
        log.error("ending every request: the node failed", requests=len(ids), reason=reason)
        await asyncio.gather(*(self.live.end(request_id, reason) for request_id in ids))

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests; end at once those not started here (still finding a decode node, or queued
        in the engine): their calls fail ``UNAVAILABLE`` saying the node is draining, so the gateway runs
        them on another prefill node (it retries ``UNAVAILABLE`` before the first token). Let the others
        finish (up to ``timeout_s``), then end the rest the same way; reservations on decode nodes are
        aborted."""
        self.draining = True
        queued = await self._not_started()
        if queued:
            log.info("drain: ending the requests not started here", requests=len(queued))
            await asyncio.gather(*(self.abort(rid, DRAINING_QUEUED) for rid in queued))
        await drain_requests("prefill", self.live.ids, self.abort, timeout_s)

    async def _not_started(self) -> list[str]:
        """Live requests that have not started computing here: not yet admitted to the engine (finding a
        decode node, fetching cached blocks), or admitted and still queued there (no KV blocks yet)."""
        unended = self.live.unended()
        admitted = [rid for rid in unended if rid in self.handoffs]
        queued = set(await self.worker.call(LLMEngine.not_started, admitted))
        return [rid for rid in unended if rid not in self.handoffs or rid in queued]


DRAINING_QUEUED = "the prefill node is draining and had not started it; the gateway may run it elsewhere"


async def _first_token(queue: Handoffs, sender: KVSender) -> FirstToken:
    """Send the request's blocks as they become ready, until its first token."""
    while True:
        item = await queue.get()
        if isinstance(item, FirstToken):
            return item
        await _send_ready(sender, item)


async def _commit(queue: Handoffs, sender: KVSender, first: FirstToken, num_prompt_tokens: int, trace: Any) -> None:
    """Send the last blocks (delivered with the first token) and commit the request on its decode node."""
    while not queue.empty():
        rest = queue.get_nowait()
        assert isinstance(rest, ReadyBlocks), f"unexpected {rest!r} after the first token"
        await _send_ready(sender, rest)
    with tracing.span("commit", trace, first_token=first.token_id):
        await sender.commit(first.token_id, num_prompt_tokens, first.recurrent_state, MAX_MESSAGE_PAYLOAD)
    log.debug("prefilled", decode_node=sender.address, cached_tokens=first.cached_tokens,
              kv_bytes=sender.bytes_sent, kv_blocks=sender.blocks_sent, kv_blocks_by_ipc=sender.blocks_by_ipc)


async def _send_ready(sender: KVSender, item: ReadyBlocks) -> None:
    if item.source_ids is not None:
        await sender.send_block_refs(item.first_index, item.source_ids, MAX_MESSAGE_PAYLOAD)
    else:
        await sender.send_blocks(item.first_index, item.count, item.payload, MAX_MESSAGE_PAYLOAD)

"""The prefill node's logic: reserve on a decode node, prefill in chunks, stream the KV, commit.

Per request (``prefill``): validate → reserve on one of the decode candidates, waiting in that node's
queue while it refuses (``prepare.py``; none by the deadline → ``RESOURCE_EXHAUSTED``) → open a
``TransferKV`` stream to the granted node → queue the prompt in the engine as prefill-only → after every
engine step the blocks that became complete are read out on the engine thread and sent (1–4 MiB messages;
acknowledgements are read concurrently) → when the first token is sampled, the last blocks go out and
``KVCommit`` follows → once the commit is acknowledged the blocks are released here (they stay in this
node's prefix cache). Cancellation or any failure aborts the request here and on the decode node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import grpc
import grpc.aio
import structlog
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from kvcache.kv_bytes import read_blocks
from services.common import tracing
from services.common.cancellation import uncancellable
from services.common.channel_pool import ChannelPool
from services.common.drain import drain_requests
from services.common.errors import UnavailableError
from services.common.kv_transfer_stats import KVTransferStats
from services.common.sampling_convert import sampling_to_proto
from services.common.server import grpc_options
from services.engine.engine import LLMEngine
from services.engine.sampling_params import SamplingParams
from services.engine_node.kv_ipc_wire import IpcAnswer, IpcOffer, answer_from_proto, offer_to_proto
from services.engine_node.kv_layout import kv_layout
from services.engine_node.step_spans import trace_request
from services.engine_node.worker import EngineWorker
from services.prefill_node.handoff import FirstToken, ReadyBlocks, Tracked, collect
from services.prefill_node.kv_ipc import IpcLinks, PoolExport, export_pool
from services.prefill_node.kv_sender import IpcRoute, KVSender, granted_lease_s
from services.prefill_node.live_requests import LiveRequest, LiveRequests
from services.prefill_node.prefix_store import (
    FetchedBlocks,
    PrefixStore,
    computed_prompt_blocks,
    import_fetched,
    local_prefix_blocks,
    release_hold,
)
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
        self.layout = kv_layout(engine)
        self.tracked: dict[str, Tracked] = {}  # touched on the engine thread only
        self.worker = EngineWorker(engine, self._deliver, on_step=lambda e, outs: collect(e, self.tracked, outs),
                                   num_threads=num_threads)
        self._decode_channels = ChannelPool(grpc_options())  # decode nodes come and go (DNS discovery)
        self.preparing = 0  # requests looking for a decode node (the servicer counts them as waiting)
        self.live = LiveRequests()
        self.kv_sent = KVTransferStats()
        self.draining = False
        on_gpu = engine.runner.kv_cache.device.type == "cuda"
        self.ipc_links = IpcLinks(self._export_pool, self._offer_ipc) if kv_ipc and on_gpu else None

    def start(self) -> None:
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()
        await self.prepare.close()
        if self.prefix_store is not None:
            await self.prefix_store.close()
        await self._decode_channels.close()

    def decode_stub(self, address: str) -> decode_pb2_grpc.DecodeNodeStub:
        return self._decode_channels.stub(address, decode_pb2_grpc.DecodeNodeStub)

    def _export_pool(self) -> PoolExport:
        return export_pool(self.engine.runner.kv_cache, self.layout)  # links exist only for a CUDA pool

    async def _offer_ipc(self, address: str, offer: IpcOffer) -> IpcAnswer:
        answer = await self.decode_stub(address).OpenKVIpc(offer_to_proto(offer), timeout=10.0,
                                                           metadata=tracing.outgoing())
        return answer_from_proto(answer)

    async def _ipc_route(self, address: str) -> IpcRoute | None:
        """How this request's blocks reach ``address`` by CUDA IPC, or None (bytes)."""
        links = self.ipc_links
        session = await links.session_for(address) if links is not None else None
        if session is None:
            return None
        pool = self.engine.runner.kv_cache
        return IpcRoute(session, lambda ids: read_blocks(pool, ids), lambda reason: links.fail(address, reason))

    def _deliver(self, items: list[tuple[Tracked, ReadyBlocks | FirstToken]]) -> None:
        for state, item in items:
            state.queue.put_nowait(item)

    # ---- one request ----------------------------------------------------------------------------
    async def prefill(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                      candidates: list[str], timeout_s: float | None) -> AsyncIterator[PrefillEvent]:
        """One request, registered by id from start to the end of its cleanup (``live_requests.py``)."""
        if self.draining:
            raise UnavailableError("prefill node is draining")
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

    async def _prefill(self, live: LiveRequest, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                       candidates: list[str], timeout_s: float | None) -> AsyncIterator[PrefillEvent]:
        validator = self.engine.validator
        validator.validate(validator.encode_prompt(token_ids=prompt_ids), sampling, prefill_only=True)
        block_hashes = self.engine.kv.hash_blocks(prompt_ids)
        trace = tracing.current_context()  # the Prefill span: parent of this request's spans here
        fetch = await self._start_fetch(request_id, prompt_ids, block_hashes)  # runs while a decode node is found
        self.preparing += 1
        try:
            with tracing.span("reserve", trace, candidates=len(candidates)) as reserving:
                reservation = await self._reserve(request_id, prompt_ids, block_hashes, sampling, candidates,
                                                  timeout_s)
                reserving.set_attribute("pdserve.decode_node", reservation.address)
        except BaseException:
            live.ending = True
            if fetch is not None:
                fetch.cancel()
            raise
        finally:
            self.preparing -= 1
        address, grant = reservation.address, reservation.answer
        sender = KVSender(self.decode_stub(address), request_id, self.layout, grant.block_ids, address,
                          self.kv_sent)
        finished = False
        why = "it ended the request before the commit"
        transfer = tracing.start_span("kv_transfer", trace, decode_node=address)  # the TransferKV stream
        try:  # from here on, however the request ends, the reservation is undone unless it was used
            for refusal in reservation.refusals:
                yield refusal
            yield Reserved(address, grant.num_cached_blocks, grant.lease_deadline_unix_ms)
            sender.ipc = await self._ipc_route(address)
            await sender.open(metadata=tracing.outgoing(tracing.context_with(transfer)))
            sender.keep_alive(granted_lease_s(grant, self.lease_ms))
            if fetch is not None:
                await import_fetched(self.worker, self.prefix_store, request_id, prompt_ids, await fetch)
            by_reference = sender.ipc is not None
            state = await self.worker.call(lambda e: self._admit(e, request_id, prompt_ids, sampling,
                                                                 grant.num_cached_blocks, trace, by_reference))
            while True:
                item = await state.queue.get()
                if isinstance(item, ReadyBlocks):
                    await _send_ready(sender, item)
                    continue
                if item.finish_reason is not None:  # the first token ended the request: D needs nothing
                    await self._abort_on_decode(address, request_id, "the first token finished the request")
                    finished = live.ending = True  # done here: a request reusing the id waits for the cleanup
                    yield item
                    return
                yield item
                while not state.queue.empty():  # the last step's blocks were delivered with the token
                    rest = state.queue.get_nowait()
                    assert isinstance(rest, ReadyBlocks), f"unexpected {rest!r} after the first token"
                    await _send_ready(sender, rest)
                with tracing.span("commit", trace, first_token=item.token_id):
                    await sender.commit(item.token_id, len(prompt_ids))
                finished = live.ending = True
                log.debug("prefilled", decode_node=address, cached_tokens=item.cached_tokens,
                          kv_bytes=sender.bytes_sent, kv_blocks=sender.blocks_sent,
                          kv_blocks_by_ipc=sender.blocks_by_ipc)
                yield Done(len(prompt_ids) - item.cached_tokens, sender.bytes_sent, sender.blocks_sent)
                return
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
            await uncancellable(self._clean_up(request_id, block_hashes, sender, None if finished else why))

    async def _clean_up(self, request_id: str, block_hashes: list[bytes], sender: KVSender,
                        abort_reason: str | None) -> None:
        """Close the KV stream, free what the request holds here (once the engine let it go), write its
        computed blocks back, and abort it on its decode node (``abort_reason``) unless it was committed."""
        await sender.close()
        finished = abort_reason is None
        computed = await self.worker.call(lambda e: self._forget(e, request_id, write_back=finished))
        await self.worker.released(request_id)
        if computed is not None and self.prefix_store is not None:
            self.prefix_store.write_back(request_id, block_hashes, *computed)
        if abort_reason is not None:
            await self._abort_on_decode(sender.address, request_id, abort_reason)

    async def _reserve(self, request_id: str, prompt_ids: list[int], block_hashes: list[bytes],
                       sampling: SamplingParams,
                       candidates: list[str], timeout_s: float | None) -> Reservation[decode_pb2.ReserveResponse]:
        message = decode_pb2.ReserveRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, max_tokens=sampling.max_tokens,
            block_hashes=block_hashes, lease_ms=self.lease_ms,
            sampling=sampling_to_proto(sampling), model_fingerprint=self.layout.model_fingerprint,
            layout=self.layout,
            decode_peers=candidates,  # the granting node ignores itself; the others may adopt it later
        )

        def call(address: str, rpc_timeout_s: float) -> Awaitable[decode_pb2.ReserveResponse]:
            return self.decode_stub(address).Reserve(message, timeout=rpc_timeout_s, metadata=tracing.outgoing())

        return await self.prepare.reserve(request_id, candidates, call,
                                          lambda address: self._abort_on_decode(address, request_id,
                                                                                "it gave up the reservation"),
                                          timeout_s)

    def _admit(self, engine: LLMEngine, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
               skip_blocks: int, trace: object = None, by_reference: bool = False) -> Tracked:
        request = engine.add_request(sampling=sampling, token_ids=prompt_ids, request_id=request_id,
                                     prefill_only=True)
        trace_request(request, trace, queued=True)  # queue and prefill_chunk spans from the engine thread
        state = Tracked(request, skip_blocks=skip_blocks, by_reference=by_reference)
        self.tracked[request_id] = state
        return state

    def _forget(self, engine: LLMEngine, request_id: str, write_back: bool = False) -> tuple[int, bytes] | None:
        """Release whatever the request still holds here (blocks stay in the prefix cache). With
        ``write_back`` (and a cache-store), first read out the prompt blocks it computed, to be stored."""
        computed = None
        if write_back and self.prefix_store is not None and self.prefix_store.write_through:
            computed = computed_prompt_blocks(engine, request_id)
        self._abort(engine, request_id)
        return computed

    # ---- the cache-store (prefix_store.py) ------------------------------------------------------
    async def _start_fetch(self, request_id: str, prompt_ids: list[int], block_hashes: list[bytes]
                           ) -> asyncio.Task[FetchedBlocks | None] | None:
        store = self.prefix_store
        if store is None:
            return None
        local = await self.worker.call(lambda e: local_prefix_blocks(e, prompt_ids))
        return asyncio.create_task(store.fetch(request_id, len(prompt_ids), block_hashes, local),
                                   name=f"prefix-fetch:{request_id}")

    async def _abort_on_decode(self, address: str, request_id: str, reason: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await self.decode_stub(address).Abort(
                node_pb2.AbortRequest(request_id=request_id, reason=f"the prefill node: {reason}"),
                timeout=2.0, metadata=tracing.outgoing())

    async def abort(self, request_id: str, reason: str | None = None) -> bool:
        """End the request (its call is cancelled, or fails with ``reason``) and answer once it is gone here
        and on its decode node."""
        ended = await self.live.end(request_id, reason)
        return await self.worker.call(lambda e: self._abort(e, request_id)) or ended

    def _abort(self, engine: LLMEngine, request_id: str) -> bool:
        self.tracked.pop(request_id, None)
        release_hold(engine, request_id)
        return engine.discard(request_id)

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests; let those in flight finish (up to ``timeout_s``), then end the rest: their
        calls fail ``UNAVAILABLE`` saying so, their reservations on decode nodes are aborted."""
        self.draining = True
        await drain_requests("prefill", self.live.ids, self.abort, timeout_s)


async def _send_ready(sender: KVSender, item: ReadyBlocks) -> None:
    if item.source_ids is not None:
        await sender.send_block_refs(item.first_index, item.source_ids, MAX_MESSAGE_PAYLOAD)
    else:
        await sender.send_blocks(item.first_index, item.count, item.payload, MAX_MESSAGE_PAYLOAD)

"""The decode node's logic: reservations for prefill nodes, KV received into them, decoding, token streams.

Control calls run on the engine thread through :class:`EngineWorker`; KV bytes are written into granted
blocks from the event loop (no step touches a block before its request is committed). Each request has
a :class:`TokenStream` from its reservation (or adoption) on: decoded tokens are buffered there until the
gateway attaches, and the stream ends with the finish reason and usage — or with ``moved_to`` once the
request was handed to another decode node (``handover.py``). Filling the streams and serving ``Attach``
is ``stream_delivery.py``'s.

Adoption (``Adopt``, the receiving side of a handover): blocks granted as for a reservation, the KV
fetched from the cache-store the sender names and written under the engine lock, the request added to
the decode batch and its stream created — all before the grant is answered. Any failure on the way
frees what was taken.

Engine failure (an exception escaped the engine thread): :meth:`DecodeNode.fail_all` ends every token
stream, attached or not, with ``UNAVAILABLE`` naming the failure, a later ``Attach`` fails the same way,
and ``on_engine_failure`` (set by ``serve.py``: health, exit) is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from kvcache.cuda_ipc import IpcError, gpu_uuid
from kvcache.host_identity import read_host_identity
from services.common import tracing
from services.common.drain import drain_requests
from services.common.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnavailableError,
)
from services.common.kv_transfer_stats import KVTransferStats
from services.decode_node.grants import CallerBounds, Grants
from services.decode_node.handover import HandoverAgent, Route
from services.decode_node.kv_ipc import IpcSessions
from services.decode_node.kv_stores import KVStores
from services.decode_node.migration import Migrator
from services.decode_node.peer_sightings import PeerSightings
from services.decode_node.stream_delivery import StreamDelivery
from services.decode_node.token_stream import TokenEvent, TokenStream
from services.engine.decode_role import AdoptionGrant, HandedRequest, Refusal
from services.engine.engine import LLMEngine
from services.engine.sampling_params import SamplingParams
from services.engine_node.step_spans import RequestTrace
from services.engine_node.worker import EngineWorker

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Grant:
    block_ids: list[int]
    num_cached_blocks: int
    lease_deadline_unix_ms: int
    lease_s: float
    token: bytes = field(default=b"", repr=False)  # the grant's capability (grants.py): never logged


class DecodeNode:
    def __init__(self, engine: LLMEngine, default_lease_s: float = 10.0, num_threads: int | None = None,
                 handover_after_s: float = 0.0, kv_ipc: bool = False, unread_stream_s: float | None = None,
                 max_reservations_per_caller: int = 256, max_reserved_blocks_fraction: float = 0.5,
                 reattach_grace_s: float = 30.0):
        """``handover_after_s``: hand preempted requests whose KV is in the cache-store (the engine's
        ``offload_cache_store``) to a peer after waiting that long; 0 = never. ``kv_ipc``: take KV by CUDA
        IPC from prefill nodes on this host and GPU (a CPU pool never does). ``unread_stream_s`` (default:
        the lease, at least 10 s): how long the token stream of a request that finished with nobody
        attached is kept (the gateway attaches as soon as the reservation is made, so it went away and its
        ``Abort`` was lost); then it is dropped, and nothing of the request is left here.
        ``max_reservations_per_caller`` and ``max_reserved_blocks_fraction`` (of the pool, and of the
        batch's ``max_num_seqs`` slots: grants take slots too): what one caller may hold in live grants
        (``grants.py``). ``reattach_grace_s``: how long a request whose ``Attach``
        call ended before its stream did runs on with nobody attached, waiting for the gateway to attach
        again (then it is aborted), and how long the stream of one that ended is kept for such a re-attach."""
        self.engine = engine
        self.default_lease_s = default_lease_s
        unread_s = max(default_lease_s, 10.0) if unread_stream_s is None else unread_stream_s
        self.delivery = StreamDelivery(self, unread_s, reattach_grace_s)  # fills the streams, serves Attach
        self._writing: Counter[str] = Counter()  # requests with a block batch being written (never expired)
        self.worker = EngineWorker(engine, self.delivery.deliver, on_tick=self._expire, num_threads=num_threads,
                                   on_failure=self._engine_failed)
        self.failure = ""  # why this node failed (its engine thread): every stream ends with it
        self.on_engine_failure: Callable[[str], None] | None = None  # told the failure (serve.py)
        self.streams: dict[str, TokenStream] = {}
        self.draining = False
        self.address = ""  # as peers know this node; set once the server is bound
        self.routes: dict[str, Route] = {}  # where each request may be handed over to
        self.moved: dict[str, str] = {}  # handed over, moved_to not yet delivered: request id → adopter
        self.handover = HandoverAgent(self, handover_after_s, engine.config.offload_cache_store,
                                      address=lambda: self.address)
        self.migration = Migrator(self)  # a drain's or a rebalance's: running requests to the peers
        self.gateway_peers = PeerSightings()  # decode nodes the gateways' polls name healthy (migration targets)
        self.kv_received = KVTransferStats()
        layout, pool = engine.kv_layout_spec(), engine.kv_pool
        self.stores = KVStores(layout)  # where adopted requests' KV is read
        identity = read_host_identity(gpu_uuid(pool.device)) if kv_ipc and pool.device.type == "cuda" else None
        self.ipc = IpcSessions(pool, layout, identity)
        max_blocks = max(1, int(max_reserved_blocks_fraction * engine.kv.num_blocks))
        max_slots = max(1, int(max_reserved_blocks_fraction * engine.config.max_num_seqs))
        self.grants = Grants(CallerBounds(min(max_reservations_per_caller, max_slots), max_blocks))

    def start(self) -> None:
        self.worker.start()
        self.handover.start()

    async def stop(self) -> None:
        await self.handover.stop()
        await self.worker.stop()
        self.ipc.close()
        await self.stores.close()

    # ---- reservations and KV --------------------------------------------------------------------
    async def reserve(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                      lease_s: float | None, route: Route | None = None, caller: str = "") -> Grant | Refusal:
        """Grant blocks for a prompt ``caller`` will send, with a fresh token. Refused (nothing held, the
        request not remembered as a waiter) when ``caller`` is at its bounds (``grants.py``)."""
        if self.draining:
            raise UnavailableError("decode node is draining")
        self._check_stream_free(request_id)
        # this node's setting caps it; a lease too short to cover a batch's write is raised to 1 s (or the
        # node's own lease if that is shorter)
        shortest = min(MIN_LEASE_S, self.default_lease_s)
        lease_s = max(min(lease_s or self.default_lease_s, self.default_lease_s), shortest)
        try:
            record = self.grants.hold(request_id, caller, -(-len(prompt_ids) // self.engine.kv.block_size))
        except ResourceExhaustedError as bound:
            return Refusal(str(bound))
        try:  # the engine call is queued before any await: an abort's discard runs after it
            result = await self.worker.call(LLMEngine.reserve, request_id, prompt_ids, sampling, lease_s)
        except BaseException:
            self.grants.release(request_id, record)
            raise
        if isinstance(result, Refusal):
            self.grants.release(request_id, record)
            return result
        token = self.grants.grant(request_id, record, len(result.block_ids))
        if token is None:  # aborted while the engine decided: that abort's discard freed the blocks
            return Refusal("the request was aborted while it was being reserved")
        self.streams[request_id] = stream = TokenStream()
        self.delivery.expect_attach(request_id, stream)
        self._set_route(request_id, route)
        return Grant(list(result.block_ids), result.num_cached_blocks, _unix_ms(lease_s), lease_s, token)

    async def receive(self, request_id: str, block_ids: list[int], payload: bytes) -> int:
        """Check and mark ``block_ids`` on the engine thread, then write their bytes. Returns the lease."""
        started = time.perf_counter()
        with self._writing_batch(request_id):
            lease_s = await self.worker.call(LLMEngine.receive_blocks, request_id, block_ids)
            try:
                self.engine.write_kv_blocks(block_ids, payload)  # blocks this reservation holds: no lock
            except ValueError as exc:
                await self.abort(request_id, f"its KV did not fit this node's cache: {exc}")
                raise FailedPreconditionError(f"{request_id}: {exc}") from exc
        self.kv_received.add(len(payload), len(block_ids), time.perf_counter() - started)
        return _unix_ms(lease_s)

    @contextlib.contextmanager
    def _writing_batch(self, request_id: str) -> Iterator[None]:
        """From before a batch's blocks are marked received until its bytes are in them: the engine thread's
        expiry (``_expire``) leaves the reservation alone meanwhile."""
        self._writing[request_id] += 1
        try:
            yield
        finally:
            self._writing[request_id] -= 1
            if self._writing[request_id] <= 0:
                del self._writing[request_id]

    async def receive_state(self, request_id: str, offset: int, total_bytes: int, payload: bytes) -> int:
        """A piece of a hybrid model's recurrent state, kept with the reservation until its commit. Returns the
        lease."""
        lease_s = await self.worker.call(LLMEngine.receive_state, request_id, offset, total_bytes, payload)
        self.kv_received.add(len(payload), 0, 0.0)
        return _unix_ms(lease_s)

    async def renew(self, request_id: str) -> int:
        """A keepalive from the prefill node: the lease holds on. Returns it."""
        return _unix_ms(await self.worker.call(LLMEngine.renew_reservation, request_id))

    async def receive_by_reference(self, request_id: str, block_ids: list[int], source_ids: list[int],
                                   session_id: str) -> int:
        """Check and mark ``block_ids`` on the engine thread, then copy blocks ``source_ids`` of the
        prefill node's pool (IPC session ``session_id``) into them. Returns the lease. Raises
        ``IpcError`` when the copy fails; the blocks are then unmarked, so the bytes may follow."""
        started = time.perf_counter()
        with self._writing_batch(request_id):
            lease_s = await self.worker.call(LLMEngine.receive_blocks, request_id, block_ids)
            try:
                self.ipc.copy(session_id, source_ids, block_ids)
            except IpcError:
                await self.worker.call(LLMEngine.unreceive_blocks, request_id, block_ids)
                raise
        size = len(block_ids) * self.ipc.layout.bytes_per_block
        self.kv_received.add(size, len(block_ids), time.perf_counter() - started)
        return _unix_ms(lease_s)

    async def commit(self, request_id: str, first_token_id: int, num_computed_tokens: int = 0) -> None:
        """The request joins the decode batch; its ``decode`` span (tracing on) goes under the gateway's
        Attach when that came first (the usual order), else under the commit."""
        stream = self.streams.get(request_id)
        parent = stream.trace if stream is not None and stream.trace is not None else tracing.current_context()
        await self.worker.call(LLMEngine.commit, request_id, first_token_id, _trace(parent), num_computed_tokens)
        self.grants.release(request_id)  # it runs now: no prefill node may touch it again

    async def abort(self, request_id: str, reason: str = "aborted") -> bool:
        """Free everything the request holds here; an attached gateway hears ``reason``."""
        self.grants.release(request_id)
        found = await self.worker.call(LLMEngine.discard, request_id)
        self.routes.pop(request_id, None)
        stream = self.streams.pop(request_id, None)
        if stream is not None:
            stream.queue.put_nowait(TokenEvent([], finish_reason="abort", abort_reason=reason))
        adopter = self.moved.pop(request_id, None)
        if adopter is not None:  # handed over before the gateway heard: it runs there now
            await self.handover.abort_on(adopter, request_id)
        await self.worker.released(request_id)  # the id may be used again once this answers
        return found or stream is not None or adopter is not None

    # ---- handover: adopting a request another decode node preempted ------------------------------
    async def adopt(self, handed: HandedRequest, cache_store: str, route: Route | None = None) -> Refusal | None:
        """Take over ``handed``: None when it runs here (its stream exists), else the refusal. Raises
        ``UnavailableError`` when draining or the cache-store cannot serve its KV (nothing is kept)."""
        if self.draining:
            raise UnavailableError("decode node is draining")
        rid = handed.request_id
        self._check_stream_free(rid)
        grant: AdoptionGrant | Refusal = await self.worker.call(LLMEngine.adopt, handed, self.default_lease_s)
        if isinstance(grant, Refusal):
            return grant
        adopted = False
        try:
            payload = await self.stores.fetch(cache_store, grant.keys)
            try:
                trace = _trace(tracing.current_context())  # under the Adopt span
                await self.worker.call(LLMEngine.complete_adoption, rid, payload, trace)
            except ValueError as error:  # the blocks the store returned do not fill the grant
                raise UnavailableError(f"cache-store {cache_store}: {error}") from error
            self.streams[rid] = stream = TokenStream()  # before any step of it can deliver (no await since)
            self.delivery.expect_attach(rid, stream)
            self._set_route(rid, route)
            adopted = True
        finally:
            if not adopted:  # refused midway, failed or cancelled: give back what was granted
                await self.worker.call(LLMEngine.discard, rid)
        return None

    def _check_stream_free(self, request_id: str) -> None:
        """A new request may not take the id of a token stream a gateway has yet to read here: one running,
        or finished and unread, or handed over and the gateway not yet told. Its new stream would replace
        the old one, and the gateway's Attach would read the newcomer's tokens. An id is free again once its
        stream was read to its end (a client may reuse its request ids; the ended stream kept for a
        re-attach then gives way) or its request was aborted (an abort removes its stream)."""
        if request_id in self.streams or request_id in self.moved:
            raise InvalidArgumentError("request_id", f"request {request_id!r} still has a token stream on this "
                                                     "node that its gateway has not read")

    def moved_to(self, request_id: str, adopter: str) -> bool:
        """The request was handed over: its stream here ends by naming the adopter. False if nobody can
        hear it (the stream is gone): the adopter should drop the request then."""
        self.routes.pop(request_id, None)
        stream = self.streams.get(request_id)
        if stream is None:
            return False
        self.moved[request_id] = adopter
        stream.queue.put_nowait(TokenEvent([], moved_to=adopter))
        return True

    def _set_route(self, request_id: str, route: Route | None) -> None:
        if route is None:
            return
        peers = [p for p in dict.fromkeys(route.peers) if p and p != self.address]
        self.routes[request_id] = Route(peers, route.deadline_unix_ms)

    # ---- tokens to the gateway (stream_delivery.py) ----------------------------------------------
    def attach(self, request_id: str, resume_after: int = 0) -> AsyncIterator[TokenEvent]:
        """The request's events after the first ``resume_after`` tokens this node's streams of it hold
        (``token_stream.py``), then the live ones. A newer ``attach`` of the same request takes over
        (this one ends ``FAILED_PRECONDITION``). When the reader goes away before the stream ended (the
        gateway's call broke or was cancelled), the request runs on for ``reattach_grace_s`` waiting for
        a re-attach, then is aborted; an ``Abort`` still aborts it at once."""
        return self.delivery.attach(request_id, resume_after)

    def _engine_failed(self, error: BaseException) -> None:
        reason = f"the engine failed: {error!r}"
        self.fail_all(reason)
        if self.on_engine_failure is not None:
            self.on_engine_failure(reason)

    def fail_all(self, reason: str) -> None:
        """This node cannot go on: every token stream, attached or waiting for its ``Attach``, ends
        ``UNAVAILABLE`` with ``reason``; so does every later ``Attach``. Nothing is aborted on the engine
        (it is gone); requests handed over elsewhere run on there."""
        self.failure = reason
        self.routes.clear()
        for stream in self.streams.values():
            stream.queue.put_nowait(TokenEvent([], error=reason))
        log.error("ended every token stream: the node failed", streams=len(self.streams), reason=reason)

    def _expire(self, engine: LLMEngine) -> tuple[str, list[str]] | None:
        """On the engine thread, between steps. A reservation whose batch the event loop is writing is not
        expired under the write (``receive``): its blocks would go back to the pool with the bytes still
        landing in them."""
        engine.evict_for_migration()  # a drain's marked requests, between steps (migration.py)
        expired = engine.expire_reservations(frozenset(self._writing))
        return ("expired", expired) if expired else None

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuse new reservations and adoptions; hand running requests to peers (``migration.py``: their KV
        through the cache-store this node offloads to, else to be recomputed there); let the rest finish
        here (up to ``timeout_s`` in all), then abort what is left."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await self.migration.migrate_all(timeout_s)
        wait_s = round(max(0.0, deadline - loop.time()), 1)  # what is left of it
        await drain_requests("decode", lambda: list(self.streams), self.abort, wait_s)


MIN_LEASE_S = 1.0
"""The shortest lease a ``Reserve`` may ask (``lease_ms``); shorter asks get this."""


def _trace(parent: Any) -> RequestTrace | None:
    """The engine's span hook for a request traced under ``parent`` (None: tracing off, no hook)."""
    return RequestTrace(parent) if parent is not None else None


def _unix_ms(after_s: float) -> int:
    return int((time.time() + after_s) * 1000)

"""The sending side of a handover: preempted requests whose KV waits in the cache-store are offered to the
other decode nodes instead of waiting here for room.

Every ``poll_s`` the agent asks the engine which preempted requests have had their KV in the cache-store
for ``after_s`` (``handover.py`` in the engine); each is lent out of the queue and offered with ``Adopt``
to its decode peers (those the prefill node listed at ``Reserve``, this node left out), in order. The
first that grants takes it: the engine lets it go and its token stream here ends with ``moved_to``. When
every peer refuses or fails, the request goes back to the head of this node's queue exactly as it was,
to resume here or be offered again after another ``after_s``. A request aborted while offered is
aborted on the peer that granted it too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from services.decode_node.peer_client import DecodePeers, Offer, PeerCallError
from services.engine.decode_role import HandedRequest
from services.engine.engine import LLMEngine

if TYPE_CHECKING:
    from services.decode_node.node import DecodeNode

log = structlog.get_logger(__name__)


@dataclass
class Route:
    """What this node knows of where a request may go next."""

    peers: list[str] = field(default_factory=list)  # other decode nodes, best first
    deadline_unix_ms: int = 0


class HandoverAgent:
    def __init__(self, node: DecodeNode, after_s: float, cache_store: str, poll_s: float = 0.05,
                 rpc_timeout_s: float = 10.0, address: Callable[[], str] = str):
        self.node = node
        self.after_s = after_s
        self.cache_store = cache_store  # where this node's offloaded KV lives (the adopter reads it there)
        self.poll_s = poll_s
        self.rpc_timeout_s = rpc_timeout_s
        self.peers = DecodePeers(rpc_timeout_s)
        self._address = address
        self._offers: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.after_s > 0 and bool(self.cache_store)

    def start(self) -> None:
        if self.enabled:
            self._loop = asyncio.create_task(self._run(), name="handover")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop, *self._offers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.peers.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            routes = self.node.routes
            if not any(r.peers for r in routes.values()):
                continue
            due = await self.node.worker.call(LLMEngine.handovers_due, self.after_s)
            for request_id in due:
                route = routes.get(request_id)
                if route is not None and route.peers and request_id not in self._offers:
                    task = asyncio.create_task(self._offer(request_id, route), name=f"handover:{request_id}")
                    self._offers[request_id] = task
                    task.add_done_callback(lambda _t, rid=request_id: self._offers.pop(rid, None))

    async def _offer(self, request_id: str, route: Route) -> None:
        handed = await self.node.worker.call(LLMEngine.lend, request_id)
        if handed is not None:
            await self.place(handed, route)

    async def place(self, handed: HandedRequest, route: Route) -> str | None:
        """Offer a lent request to the route's peers in order and settle the loan: the peer that took it
        (its stream here ends with ``moved_to``), or None (it waits here again, or was aborted here)."""
        request_id, taker = handed.request_id, None
        try:
            for peer in route.peers:
                if await self._adopt(peer, handed, route):
                    taker = peer
                    break
        finally:
            kept = await self.node.worker.call(LLMEngine.settle_handover, request_id, taker is not None)
        if taker is None:
            return None
        if not kept or not self.node.moved_to(request_id, taker):  # aborted here meanwhile: drop it there too
            await self.abort_on(taker, request_id)
            return None
        return taker

    async def _adopt(self, peer: str, handed: HandedRequest, route: Route) -> bool:
        me = self._address()
        offer = Offer(self.node.engine.fingerprint, self.cache_store, me,
                      [p for p in (me, *route.peers) if p and p != peer], route.deadline_unix_ms)
        try:
            answer = await self.peers.adopt(peer, handed, offer, self._trace(handed.request_id))
        except PeerCallError as error:
            log.warning("handover failed", request_id=handed.request_id, peer=peer, code=error.code,
                        details=error.details)
            return False
        if not answer.granted:
            log.info("handover refused", request_id=handed.request_id, peer=peer, reason=answer.reason)
            return False
        log.info("handed over", request_id=handed.request_id, peer=peer,
                 output_tokens=len(handed.output_token_ids), blocks=len(handed.kv_keys))
        return True

    def _trace(self, request_id: str) -> Any:
        """The request's trace context here (its Attach span), so the adopter's spans join its trace."""
        stream = self.node.streams.get(request_id)
        return stream.trace if stream is not None else None

    async def abort_on(self, peer: str, request_id: str) -> None:
        """Best-effort ``Abort`` of a request this node handed to ``peer``."""
        try:
            reason = "the decode node that handed it over: it was aborted there"
            await self.peers.abort(peer, request_id, reason)
        except PeerCallError as error:
            log.warning("abort on the adopting node failed", request_id=request_id, peer=peer, code=error.code)

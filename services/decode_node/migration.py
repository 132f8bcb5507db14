"""Live migration: a decode node hands running requests to its peers instead of cutting them — every one
on drain (:meth:`Migrator.migrate_all`), or a chosen few while it serves on (``Admin/Rebalance``,
:meth:`Migrator.migrate_some`).

Each request to move is marked in the engine (``handover.py`` there); between two steps the engine takes
each marked request that decodes out of the batch. On a node that offloads to a cache-store
(``--offload-cache-store``) its KV is copied there (whatever ``--offload-remote`` says) and, once stored,
the request is lent and offered to the peers with ``Adopt`` — the handover path, without the
``--handover-after-ms`` wait, at most ``max_in_flight`` offers at a time. A node with no cache-store lends
it at once as tokens only: its adopter recomputes the KV (prompt and generated tokens), the tokens, the
sampling state (seeded sampling is keyed by position) and a grammar's state going on exactly. The first
peer that grants takes it; its stream here ends with ``moved_to`` and the gateway follows it there.

The peers: those its prefill node listed at ``Reserve`` (this node left out), then the decode nodes the
gateways' status polls named healthy within the last minute (``peer_sightings.py``): the new node of a
rolling update that joined after the request started is one of them.

A request no peer takes goes back to the head of this node's queue and resumes here (from its copy, or
recomputed). On drain it is offered again after ``retry_first_s``, then after twice as long each time (at
most ``retry_max_s``), while the drain timeout lasts: it moves as soon as a peer has room, and finishes
here if none ever does. A request still reserving (its prefill node sends its KV) is migrated once it is
committed and decodes. The drain then waits for what is left here, as before.

Counted in :class:`MigrationStats` (the decode node's ``/metrics``): requests moved with their KV, moved
to be recomputed, kept (no peer took them), the KV bytes moved, and the seconds from a request's mark to
its peer's grant.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from services.decode_node.handover import Route
from services.engine.decode_role import HandedRequest, MigrationPoll
from services.engine.engine import LLMEngine

if TYPE_CHECKING:
    from services.decode_node.node import DecodeNode

log = structlog.get_logger(__name__)


@dataclass
class MigrationStats:
    moved_total: int = 0  # with their KV (read by the adopter from the cache-store)
    recomputed_total: int = 0  # as tokens only: the adopter recomputed their KV
    kept_total: int = 0  # offered, taken by no peer: they finished here
    moved_bytes_total: int = 0  # KV bytes the adopters read from the cache-store
    seconds_total: float = 0.0  # mark → grant, summed over the moved and recomputed requests

    def outcomes(self) -> list[tuple[str, int]]:
        return [("moved", self.moved_total), ("recomputed", self.recomputed_total), ("kept", self.kept_total)]


@dataclass
class MigrationOutcome:
    """One migration's end: the ids now running on a peer, and those offered that no peer took."""

    moved: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


class Migrator:
    def __init__(self, node: DecodeNode, max_in_flight: int = 4, poll_s: float = 0.02, retry_first_s: float = 0.5,
                 retry_max_s: float = 4.0):
        self.node = node
        self.max_in_flight = max_in_flight
        self.poll_s = poll_s
        self.retry_first_s = retry_first_s
        self.retry_max_s = retry_max_s
        self.stats = MigrationStats()
        self._lock = asyncio.Lock()  # one migration at a time (a rebalance, then the drain)

    async def migrate_all(self, within_s: float) -> MigrationOutcome:
        """Drain: move every request with a peer within ``within_s``, offering a refused one again (see the
        module's docstring); returns early once none is left here to move."""
        return await self._migrate(lambda: list(self.node.routes), within_s, retry=True, why="drain")

    async def migrate_some(self, request_ids: Sequence[str], within_s: float) -> MigrationOutcome:
        """Rebalance: offer each of ``request_ids`` once; returns when each was moved or kept here."""
        wanted = list(request_ids)
        return await self._migrate(lambda: [r for r in wanted if r in self.node.routes], within_s, retry=False,
                                   why="rebalance")

    async def rebalance(self, max_requests: int, within_s: float, reason: str) -> tuple[list[str], list[str]]:
        """``Admin/Rebalance``: offer the ``max_requests`` most recently admitted decoding requests that have
        peers, once each, while this node serves on. The moved and the kept ids."""
        newest = await self.node.worker.call(LLMEngine.newest_decoding, max_requests)
        outcome = await self.migrate_some([rid for rid in newest if self.peers_of(rid).peers], within_s)
        return outcome.moved, outcome.kept

    def peers_of(self, request_id: str) -> Route:
        route = self.node.routes.get(request_id)
        if route is None:
            return Route()  # gone (aborted, finished): the loan is settled as such
        return self.node.gateway_peers.widen(route, self.node.address)

    async def _migrate(self, candidates: Callable[[], list[str]], within_s: float, retry: bool,
                       why: str) -> MigrationOutcome:
        async with self._lock:
            run = _Run(self, retry, asyncio.get_running_loop().time() + within_s, why)
            outcome = await run.until_done(candidates)
        self.stats.kept_total += len(outcome.kept)
        log.info(f"{why}: migration done", moved=len(outcome.moved), kept=len(outcome.kept),
                 seconds=round(within_s - max(0.0, run.deadline - asyncio.get_running_loop().time()), 3))
        return outcome


class _Run:
    """One migration: which requests are marked, offered, or wait to be offered again."""

    def __init__(self, migrator: Migrator, retry: bool, deadline: float, why: str):
        self.m, self.node, self.retry, self.deadline, self.why = migrator, migrator.node, retry, deadline, why
        self.loop = asyncio.get_running_loop()
        self.marked_at: dict[str, float] = {}  # marked (until offered; one that finished first stays here)
        self.again_at: dict[str, tuple[float, float]] = {}  # refused: when to offer again, the delay used
        self.outcome = MigrationOutcome()
        self.refused: set[str] = set()
        self.offers: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(migrator.max_in_flight)

    async def until_done(self, candidates: Callable[[], list[str]]) -> MigrationOutcome:
        try:
            while self.loop.time() < self.deadline:
                now, here = self.loop.time(), candidates()
                due = [rid for rid in here if rid not in self.marked_at and self.again_at.get(rid, (0.0,))[0] <= now
                       and (self.retry or rid not in self.refused) and self.m.peers_of(rid).peers]
                if due:
                    for rid in await self.node.worker.call(LLMEngine.mark_for_migration, due):
                        self.marked_at[rid] = self.loop.time()
                poll: MigrationPoll = await self.node.worker.call(LLMEngine.migrations_ready)
                for handed in poll.ready:
                    task = asyncio.create_task(self._offer(handed), name=f"migrate:{handed.request_id}")
                    self.offers.add(task)
                    task.add_done_callback(self.offers.discard)
                waiting = self.retry and any(rid in self.again_at for rid in here)
                if not due and not waiting and not poll.pending and not self.offers:
                    break
                await asyncio.sleep(self.m.poll_s)
        finally:
            self.refused.update(await self.node.worker.call(LLMEngine.end_migrations))
            await self._settle()
        moved = set(self.outcome.moved)
        self.outcome.kept = sorted(rid for rid in self.refused if rid not in moved)
        return self.outcome

    async def _settle(self) -> None:
        """Let the offers under way end (each settles its loan however it ends); past the deadline they
        are cancelled."""
        if not self.offers:
            return
        _, late = await asyncio.wait(set(self.offers), timeout=max(0.0, self.deadline - self.loop.time()))
        for task in late:
            task.cancel()
        for task in late:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _offer(self, handed: HandedRequest) -> None:
        rid = handed.request_id
        try:
            async with self.slots:
                route = self.m.peers_of(rid)
                taker = await self.node.handover.place(handed, route)
        finally:
            marked_at = self.marked_at.pop(rid, self.loop.time())
        if taker is None:
            self.refused.add(rid)
            delay = min(self.m.retry_max_s, 2 * self.again_at.get(rid, (0.0, self.m.retry_first_s / 2))[1])
            self.again_at[rid] = (self.loop.time() + delay, delay)
            log.info("migration: no peer took the request; it goes on here", request_id=rid, peers=len(route.peers),
                     again_in_s=delay if self.retry else None)
            return
        self._count(handed, taker, self.loop.time() - marked_at)

    def _count(self, handed: HandedRequest, taker: str, seconds: float) -> None:
        stats = self.m.stats
        self.outcome.moved.append(handed.request_id)
        size = len(handed.kv_keys) * self.node.engine.kv_layout_spec().bytes_per_block
        if handed.recompute:
            stats.recomputed_total += 1
        else:
            stats.moved_total += 1
        stats.moved_bytes_total += size
        stats.seconds_total += seconds
        log.info(f"{self.why}: migrated", request_id=handed.request_id, peer=taker, recompute=handed.recompute,
                 output_tokens=len(handed.output_token_ids), blocks=len(handed.kv_keys), bytes=size,
                 seconds=round(seconds, 3))

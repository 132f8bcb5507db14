"""Live migration on drain: a draining decode node hands its running requests to its peers instead of
cutting them.

:meth:`Migrator.migrate_all` runs first in :meth:`DecodeNode.drain` (the node admits nothing new by then).
Each request that has peers to go to (its route: the decode candidates the prefill node listed at
``Reserve``, this node left out) is marked in the engine (``handover.py`` there); between two steps the
engine takes each marked request that decodes out of the batch, its KV copied to the cache-store this node
offloads to (whatever ``--offload-remote`` says), and once the copy is stored the request is lent and
offered to the peers in order with ``Adopt`` — the handover path, without the ``--handover-after-ms`` wait,
at most ``max_in_flight`` offers at a time. The first peer that grants takes it; its stream here ends with
``moved_to`` and the gateway follows it there. A request no peer takes goes back to the head of this
node's queue and resumes here from its copy (it is not offered again); so does one whose copy was not
stored by the end of the migration. The drain then waits for what is left here, as before.

A request still reserving (its prefill node sends its KV) is migrated once it is committed and decodes.
A node without an offload cache-store (no ``--offload-cache-store``) migrates nothing.

Counted in :class:`MigrationStats` (the decode node's ``/metrics``): requests moved, kept (no peer took
them, or their copy was not stored in time), the KV bytes moved, and the seconds from a request's mark to
its peer's grant.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from services.decode_node.handover import Route
from services.engine.decode_role import HandedRequest, MigrationPoll
from services.engine.engine import LLMEngine

if TYPE_CHECKING:
    from services.decode_node.node import DecodeNode

log = structlog.get_logger(__name__)

OUTCOMES = ("moved", "kept")  # kept: it finishes here (no peer took it, or its copy was not stored in time)


@dataclass
class MigrationStats:
    moved_total: int = 0
    kept_total: int = 0
    moved_bytes_total: int = 0  # KV bytes the adopters read from the cache-store
    seconds_total: float = 0.0  # mark → grant, summed over the moved requests

    def outcomes(self) -> list[tuple[str, int]]:
        return [("moved", self.moved_total), ("kept", self.kept_total)]


class Migrator:
    def __init__(self, node: DecodeNode, max_in_flight: int = 4, poll_s: float = 0.02):
        self.node = node
        self.max_in_flight = max_in_flight
        self.poll_s = poll_s
        self.stats = MigrationStats()
        self._marked_at: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        """Only a node that offloads to a cache-store can migrate (its peers read the KV there)."""
        return bool(self.node.engine.config.offload_cache_store)

    async def migrate_all(self, within_s: float) -> None:
        """Move what can be moved within ``within_s``; returns early once every request with peers was
        offered (or there is none). What was not moved by then resumes here."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        slots = asyncio.Semaphore(self.max_in_flight)
        offers: set[asyncio.Task[None]] = set()
        started, self._marked_at = loop.time(), {}
        try:
            while loop.time() < deadline:
                left = [rid for rid, route in self.node.routes.items() if route.peers and rid not in self._marked_at]
                if left:
                    for rid in await self.node.worker.call(LLMEngine.mark_for_migration, left):
                        self._marked_at[rid] = loop.time()
                poll: MigrationPoll = await self.node.worker.call(LLMEngine.migrations_ready)
                for handed in poll.ready:
                    task = asyncio.create_task(self._offer(handed, slots), name=f"migrate:{handed.request_id}")
                    offers.add(task)
                    task.add_done_callback(offers.discard)
                if not left and not poll.pending and not offers:
                    break
                await asyncio.sleep(self.poll_s)
        finally:
            back = await self.node.worker.call(LLMEngine.end_migrations)
            self.stats.kept_total += len(back)
            await self._settle(offers, deadline)
        log.info("drain: migration done", moved=self.stats.moved_total, kept=self.stats.kept_total,
                 seconds=round(loop.time() - started, 3))

    async def _settle(self, offers: set[asyncio.Task[None]], deadline: float) -> None:
        """Let the offers under way end (each settles its loan however it ends); past the deadline they
        are cancelled."""
        if not offers:
            return
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        _, late = await asyncio.wait(set(offers), timeout=remaining)
        for task in late:
            task.cancel()
        for task in late:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _offer(self, handed: HandedRequest, slots: asyncio.Semaphore) -> None:
        rid = handed.request_id
        async with slots:
            route = self.node.routes.get(rid) or Route()  # none: aborted meanwhile (the loan is settled as such)
            taker = await self.node.handover.place(handed, route)
        if taker is None:
            self.stats.kept_total += 1
            log.info("drain: no peer took the request; it finishes here", request_id=rid, peers=len(route.peers))
            return
        seconds = asyncio.get_running_loop().time() - self._marked_at.get(rid, 0.0)
        size = len(handed.kv_keys) * self.node.engine.kv_layout_spec().bytes_per_block
        self.stats.moved_total += 1
        self.stats.moved_bytes_total += size
        self.stats.seconds_total += seconds
        log.info("drain: migrated", request_id=rid, peer=taker, output_tokens=len(handed.output_token_ids),
                 blocks=len(handed.kv_keys), bytes=size, seconds=round(seconds, 3))

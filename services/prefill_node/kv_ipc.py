"""The prefill node's side of CUDA IPC: one handshake per decode node, then blocks sent by reference.

Per decode node the link goes ``UNTRIED → OFFERING → READY`` (the node mapped this process's pool and read
the probe back right) or ``→ FALLBACK`` (refused, unreachable, wrong probe digest, or a later copy failed):
bytes are streamed to that node, and after ``retry_after_s`` the next request offers again (a decode node
that restarted gets a new chance). Requests that arrive while an offer is in flight wait for its answer;
an offer is never repeated concurrently. The pool's handle and the probe are exported once per process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import grpc.aio
import structlog
import torch

from kvcache.cuda_ipc import IpcError, export_tensor, gpu_uuid, make_probe, probe_digest, probe_pattern
from kvcache.host_identity import read_host_identity
from services.engine.kv_layout_spec import KVLayoutSpec
from services.engine_node.kv_ipc_wire import IpcAnswer, IpcOffer

log = structlog.get_logger(__name__)
RETRY_AFTER_S = 300.0


class LinkState(enum.Enum):
    UNTRIED = "untried"
    OFFERING = "offering"
    READY = "ready"
    FALLBACK = "fallback"


@dataclass
class Link:
    state: LinkState = LinkState.UNTRIED
    session_id: str = ""
    reason: str = ""
    retry_at: float = 0.0
    pending: asyncio.Task[str | None] | None = None


@dataclass(frozen=True)
class PoolExport:
    """This process's offer, and the probe tensor that must stay alive while peers may map it."""

    offer: IpcOffer
    probe: torch.Tensor


def export_pool(pool: torch.Tensor, layout: KVLayoutSpec) -> PoolExport:
    """Export a CUDA KV pool ``[layers, blocks, ...]`` and a fresh probe. Raises ``IpcError``."""
    if pool.device.type != "cuda":
        raise IpcError(f"only CUDA pools are exported, not one on {pool.device}")
    nonce = os.urandom(16)
    probe = make_probe(nonce, pool.device)
    identity = read_host_identity(gpu_uuid(pool.device))
    offer = IpcOffer(session_id=uuid.uuid4().hex, identity=identity, layout=layout, pool=export_tensor(pool),
                     probe=export_tensor(probe), probe_nonce=nonce)
    return PoolExport(offer, probe)


class IpcLinks:
    """Which decode nodes take this prefill node's KV by CUDA IPC (one ``Link`` each).

    ``export``: builds this process's ``PoolExport`` (called once, on the first offer), or returns None
    when IPC cannot apply here (a CPU pool). ``send_offer(address, offer)``: the ``OpenKVIpc`` call."""

    def __init__(self, export: Callable[[], PoolExport | None],
                 send_offer: Callable[[str, IpcOffer], Awaitable[IpcAnswer]],
                 retry_after_s: float = RETRY_AFTER_S, clock: Callable[[], float] = time.monotonic):
        self._export_fn = export
        self._send_offer = send_offer
        self.retry_after_s = retry_after_s
        self.clock = clock
        self.links: dict[str, Link] = {}
        self._export: PoolExport | None = None
        self._export_failure = ""

    def state(self, address: str) -> LinkState:
        return self.links.get(address, Link()).state

    async def session_for(self, address: str) -> str | None:
        """The IPC session to name in this decode node's transfer headers, or None: send bytes."""
        link = self.links.setdefault(address, Link())
        if link.state is LinkState.READY:
            return link.session_id
        if link.state is LinkState.FALLBACK and self.clock() < link.retry_at:
            return None
        if link.pending is None:
            link.state = LinkState.OFFERING
            link.pending = asyncio.create_task(self._handshake(address, link), name=f"kv-ipc-offer:{address}")
        return await asyncio.shield(link.pending)

    def fail(self, address: str, reason: str) -> None:
        """A transfer to this decode node by IPC failed: bytes from now on (until ``retry_after_s``)."""
        link = self.links.setdefault(address, Link())
        if link.state is not LinkState.FALLBACK:
            self._fall_back(address, link, reason)

    async def _handshake(self, address: str, link: Link) -> str | None:
        try:
            export = self._pool_export()
            if export is None:
                return self._fall_back(address, link, self._export_failure or "no CUDA pool here", forever=True)
            # a fresh session id each handshake: the decode node keeps a session for its caller, and a re-offer
            # after a failure (its caller name changed, say) must not collide with the stale one
            offer = dataclasses.replace(export.offer, session_id=uuid.uuid4().hex)
            try:
                answer = await self._send_offer(address, offer)
            except grpc.aio.AioRpcError as exc:
                return self._fall_back(address, link, f"OpenKVIpc failed: {exc.code().name}: {exc.details()}")
            except asyncio.TimeoutError:
                return self._fall_back(address, link, "OpenKVIpc timed out")
            if not answer.accepted:
                return self._fall_back(address, link, f"refused: {answer.reason}")
            if answer.probe_digest != probe_digest(probe_pattern(offer.probe_nonce)):
                return self._fall_back(address, link, "the decode node read the probe wrong")
            link.state, link.session_id, link.reason = LinkState.READY, offer.session_id, ""
            log.info("kv ipc ready", decode_node=address, session=link.session_id)
            return link.session_id
        finally:
            link.pending = None

    def _pool_export(self) -> PoolExport | None:
        if self._export is None and not self._export_failure:
            try:
                self._export = self._export_fn()
            except IpcError as exc:
                self._export_failure = f"exporting the pool failed: {exc}"
            if self._export is None and not self._export_failure:
                self._export_failure = "no CUDA pool here"
        return self._export

    def _fall_back(self, address: str, link: Link, reason: str, forever: bool = False) -> None:
        link.state, link.session_id, link.reason = LinkState.FALLBACK, "", reason
        link.retry_at = float("inf") if forever else self.clock() + self.retry_after_s
        log.warning("kv ipc off for this decode node: sending bytes", decode_node=address, reason=reason)
        return None

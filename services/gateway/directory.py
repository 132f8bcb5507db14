"""The gateway's view of the cluster: one channel per node, its ``NodeStatus`` polled in the background.

Every ``poll_interval_s`` (and on demand) each node's ``NodeStatus`` rpc is called. An answer marks the
node healthy (unless it says it is draining, or reports another role than configured); a failed call
marks it unhealthy with zero counters, and the next poll tries again, so a restarted node rejoins by
itself. A request that sees a node fail can ``mark_failed`` it at once so that new requests avoid it
until a poll says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
import structlog
from pdserve.v1 import cache_store_pb2_grpc, decode_pb2_grpc, gateway_pb2, node_pb2, prefill_pb2_grpc

from services.common.server import grpc_options
from services.gateway.nodes import CACHE_STORE, DECODE, PREFILL, STATUS_FIELDS, NodeInfo

log = structlog.get_logger(__name__)

_STUBS: dict[str, Any] = {
    PREFILL: prefill_pb2_grpc.PrefillNodeStub,
    DECODE: decode_pb2_grpc.DecodeNodeStub,
    CACHE_STORE: cache_store_pb2_grpc.CacheStoreStub,
}

# Reconnect quickly to a node that went away, so a restarted one is seen on the next polls.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def node_info_from_status(address: str, role: str, status: gateway_pb2.NodeStatus, polled_at: float) -> NodeInfo:
    values = {name: getattr(status, name) for name in STATUS_FIELDS}
    error = ""
    if status.role and status.role != role:
        values["healthy"], error = False, f"reports role {status.role!r}, configured as {role!r}"
    elif not status.healthy:
        error = "reports itself unhealthy (draining?)"
    return NodeInfo(address=address, role=role, error=error, polled_at=polled_at, **values)


class NodeDirectory:
    def __init__(self, nodes: Sequence[tuple[str, str]], *, poll_interval_s: float = 0.5,
                 status_timeout_s: float = 1.0, max_message_bytes: int | None = None) -> None:
        """``nodes``: (address, role) pairs; an address may appear under one role only."""
        self._roles: dict[str, str] = {}
        for address, role in nodes:
            assert role in _STUBS, f"unknown role {role!r}"
            assert self._roles.get(address, role) == role, f"{address} configured as two roles"
            self._roles[address] = role
        self.poll_interval_s = poll_interval_s
        self.status_timeout_s = status_timeout_s
        options = grpc_options() if max_message_bytes is None else grpc_options(max_message_bytes)
        self._options = [*options, *_RECONNECT_OPTIONS]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._info = {a: NodeInfo(address=a, role=r, error="not polled yet") for a, r in self._roles.items()}
        self._inflight = dict.fromkeys(self._roles, 0)
        self._refreshing: asyncio.Future[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self.last_refresh = 0.0  # time.monotonic() of the last completed refresh

    # --- lifecycle ---

    async def start(self) -> None:
        """Poll every node once, then keep polling in the background."""
        await self.refresh()
        self._poller = asyncio.create_task(self._poll_forever(), name="node-directory-poll")

    async def close(self) -> None:
        for task in (self._poller, self._refreshing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._poller = self._refreshing = None
        channels, self._channels, self._stubs = self._channels, {}, {}
        await asyncio.gather(*(c.close() for c in channels.values()))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            await self.refresh()

    # --- channels ---

    def stub(self, address: str) -> Any:
        """The stub of the node's own service (PrefillNode, DecodeNode or CacheStore) on its one channel."""
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address, options=self._options)
            stub = self._stubs[address] = _STUBS[self._roles[address]](channel)
        return stub

    # --- status ---

    def nodes(self, role: str | None = None) -> list[NodeInfo]:
        """Every known node (of ``role``) as last polled, with this gateway's in-flight counts."""
        return [info if not self._inflight[a] else _with_inflight(info, self._inflight[a])
                for a, info in self._info.items() if role is None or info.role == role]

    async def refresh(self) -> None:
        """Poll every node now; concurrent callers share one round of calls."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._poll_all())
            self._refreshing.add_done_callback(self._refreshed)
        await asyncio.shield(self._refreshing)

    def _refreshed(self, future: asyncio.Future[None]) -> None:
        if self._refreshing is future:
            self._refreshing = None

    async def refresh_if_older(self, max_age_s: float) -> None:
        if time.monotonic() - self.last_refresh > max_age_s:
            await self.refresh()

    async def _poll_all(self) -> None:
        await asyncio.gather(*(self._poll(address) for address in self._roles))
        self.last_refresh = time.monotonic()

    async def _poll(self, address: str) -> None:
        role = self._roles[address]
        try:
            status = await self.stub(address).NodeStatus(node_pb2.NodeStatusRequest(),
                                                         timeout=self.status_timeout_s)
        except grpc.aio.AioRpcError as error:
            self._set(NodeInfo(address=address, role=role, polled_at=time.monotonic(),
                               error=f"{error.code().name}: {error.details()}"))
            return
        self._set(node_info_from_status(address, role, status, time.monotonic()))

    def _set(self, info: NodeInfo) -> None:
        was = self._info[info.address]
        if was.healthy != info.healthy:
            log.info("node " + ("healthy" if info.healthy else "unhealthy"), address=info.address,
                     role=info.role, **({"error": info.error} if info.error else {}))
        self._info[info.address] = info

    def mark_failed(self, address: str, reason: str) -> None:
        """A call to the node failed: treat it as down until a poll answers."""
        if address in self._info:
            self._set(NodeInfo(address=address, role=self._roles[address], polled_at=time.monotonic(),
                               error=reason))

    def claim(self, address: str) -> None:
        """Count a request routed to ``address`` as in flight there (the router reads it as load)."""
        self._inflight[address] += 1

    def release(self, address: str) -> None:
        assert self._inflight[address] > 0, f"release of {address} without a claim"
        self._inflight[address] -= 1


def _with_inflight(info: NodeInfo, inflight: int) -> NodeInfo:
    return dataclasses.replace(info, inflight=inflight)

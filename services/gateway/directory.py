"""The gateway's view of the cluster: the current nodes, one channel each, their ``NodeStatus`` polled.

Membership. Each configured entry is a source of nodes: ``host:port`` is one fixed node; a
``dns:///NAME:PORT`` entry (see ``discovery.py``) is every address NAME resolves to, re-resolved every
``resolve_interval_s``. A node is *current* while some source lists it: only current nodes are polled,
routed to and listed by ``nodes()`` (hence ``ClusterStatus``). A node that appears is polled at once, so it
can take work before the next poll round. A node that vanishes leaves ``nodes()`` at once, but its
channel stays usable for the requests already on it (``claim``/``release`` stay consistent); once none
is in flight and it has been unused for ``linger_s``, its channel is closed and its state dropped.
The role of every address seen is remembered, so a late ``stub()`` for a dropped node (an ``Attach`` to
a decode node the prefill node reserved on just before it vanished) opens a fresh channel.

Health. Every ``poll_interval_s`` (and on demand) each current node's ``NodeStatus`` rpc is called. An
answer marks the node healthy (unless it says it is draining, reports another role than configured,
serves another model than the gateway's: ``model_check``, or runs in another mode: ``mode_check``); a
failed call marks it unhealthy with zero counters, and the next poll tries again, so a restarted node
rejoins by itself. A request that sees a node fail can ``mark_failed`` it at once so that new requests
avoid it until a poll says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import grpc
import grpc.aio
import structlog

from services.common.server import grpc_options
from services.common.tls.channels import identity_generation, open_channel
from services.gateway import node_client
from services.gateway.discovery import DnsEntry, DnsWatcher, Resolver, parse_entry
from services.gateway.kv_compatibility import with_kv_compatibility
from services.gateway.left_out import LeftOutLog
from services.gateway.mode_check import with_mode_check
from services.gateway.model_check import ModelIdentity, with_model_check
from services.gateway.nodes import DECODE, NodeInfo

log = structlog.get_logger(__name__)

ROTATED_CHANNEL_GRACE_S = 3600.0  # a stream begun before a rotation keeps its channel this long

_STATIC = "static"  # the source of the host:port entries


def node_info_from_status(role: str, reported: NodeInfo, polled_at: float) -> NodeInfo:
    """The node configured as ``role`` as of a poll it answered with ``reported`` (itself as it reports
    itself): unhealthy when it reports another role, or says it is (draining?)."""
    healthy, error = reported.healthy, ""
    if reported.role and reported.role != role:
        healthy, error = False, f"reports role {reported.role!r}, configured as {role!r}"
    elif not reported.healthy:
        error = "reports itself unhealthy (draining?)"
    return dataclasses.replace(reported, role=role, healthy=healthy, error=error, polled_at=polled_at)


class NodeDirectory:
    def __init__(self, nodes: Sequence[tuple[str, str]], *, poll_interval_s: float = 0.5,
                 status_timeout_s: float = 1.0, max_message_bytes: int | None = None,
                 resolve_interval_s: float = 5.0, resolver: Resolver | None = None, linger_s: float = 10.0,
                 model: ModelIdentity | None = None, deterministic: bool = False) -> None:
        """``nodes``: (entry, role) pairs, an entry being ``host:port`` or ``dns:///NAME:PORT``; an address
        may be current under one role only. ``resolver``: see ``discovery.Resolver`` (default: the
        system's). ``model``: the gateway's own; model nodes that serve another are unhealthy (``None``:
        not checked). ``deterministic``: the gateway's mode; model nodes of the other are unhealthy."""
        self.model = model
        self.deterministic = deterministic
        self.poll_interval_s = poll_interval_s
        self.status_timeout_s = status_timeout_s
        self.resolve_interval_s = resolve_interval_s
        self.linger_s = linger_s
        self._options = grpc_options() if max_message_bytes is None else grpc_options(max_message_bytes)
        self._roles: dict[str, str] = {}  # every address ever current → its role
        self._sources: dict[str, set[str]] = {}  # current address → the entries that list it
        self._info: dict[str, NodeInfo] = {}  # current and lingering nodes
        self._inflight: dict[str, int] = {}
        self._left_out = LeftOutLog()  # nodes left out for their model, mode or KV layout, as last logged
        self._used: dict[str, float] = {}  # time.monotonic() a non-current node was last used
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}
        dns: list[DnsEntry] = []
        for entry, role in nodes:
            assert role in node_client.ROLES_WITH_STUBS, f"unknown role {role!r}"
            parsed = parse_entry(entry, role)
            if isinstance(parsed, DnsEntry):
                dns.append(parsed)
            else:
                assert self._roles.get(parsed, role) == role, f"{parsed} configured as two roles"
                self._add(_STATIC, parsed, role)
        self._dns = DnsWatcher(dns, resolver, timeout_s=max(resolve_interval_s, 1.0)) if dns else None
        self._loops: set[asyncio.Task[None]] = set()  # polling and resolving
        self._closing: set[asyncio.Task[None]] = set()  # channels of dropped nodes being closed
        self._generation = identity_generation()  # of this process's certificate files, when channels opened
        self._refreshing: asyncio.Future[None] | None = None
        self.last_refresh = 0.0  # time.monotonic() of the last completed refresh

    # --- lifecycle ---

    async def start(self) -> None:
        """Resolve the DNS entries and poll every node once, then keep doing both in the background."""
        if self._dns is not None:
            await self.resolve(poll=False)
            self._spawn(self._loops, self._every(self.resolve_interval_s, self.resolve), "node-directory-resolve")
        await self.refresh()
        self._spawn(self._loops, self._every(self.poll_interval_s, self.refresh), "node-directory-poll")

    async def close(self) -> None:
        loops, self._loops = [*self._loops, self._refreshing], set()
        for task in loops:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._refreshing = None
        channels, self._channels, self._stubs = self._channels, {}, {}
        await asyncio.gather(*self._closing, *(c.close() for c in channels.values()))

    @staticmethod
    def _spawn(tasks: set[asyncio.Task[None]], coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    @staticmethod
    async def _every(interval_s: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await step()
            except Exception:  # logged, and the loop goes on: one bad round must not stop polling
                log.exception("node directory background step failed", step=getattr(step, "__name__", ""))

    # --- membership ---

    async def resolve(self, poll: bool = True) -> None:
        """Look the DNS entries up now: add the nodes that appeared (polled at once when ``poll``),
        retire those that vanished, drop retired ones that are idle."""
        assert self._dns is not None, "no dns:/// entry to resolve"
        added: list[str] = []
        for entry, addresses in await self._dns.resolve():
            added += self._set_members(entry.text, entry.role, addresses)
        self._sweep()
        if added and poll:
            await asyncio.gather(*(self._poll(address) for address in added))

    def _set_members(self, source: str, role: str, addresses: Sequence[str]) -> list[str]:
        """Make ``source`` list exactly ``addresses``; returns the nodes that became current."""
        added = [a for a in addresses if self._add(source, a, role)]
        removed = [a for a, sources in self._sources.items() if source in sources and a not in addresses]
        for address in removed:
            self._remove(source, address)
        if added or removed:
            log.info("cluster membership changed", source=source, role=role, added=added, removed=removed,
                     current=sorted(a for a in self._sources if self._roles[a] == role))
        return added

    def _add(self, source: str, address: str, role: str) -> bool:
        if address in self._sources:
            if self._roles[address] != role:
                log.error("address already current under another role; ignored", address=address,
                          role=role, current_role=self._roles[address], source=source)
                return False
            self._sources[address].add(source)
            return False
        if self._roles.get(address, role) != role:  # a lingering node of another role: its address moved on
            self._drop(address)
        self._roles[address] = role
        self._sources[address] = {source}
        self._used.pop(address, None)
        if address not in self._info:
            self._info[address] = NodeInfo(address=address, role=role, error="not polled yet")
        return True

    def _remove(self, source: str, address: str) -> None:
        sources = self._sources[address]
        sources.discard(source)
        if not sources:
            del self._sources[address]
            self._used[address] = time.monotonic()

    def _sweep(self) -> None:
        """Drop the non-current nodes with nothing in flight, unused for ``linger_s``."""
        now = time.monotonic()
        for address in [a for a in self._used if now - self._used[a] >= self.linger_s]:
            if not self._inflight.get(address):
                self._drop(address)

    def _drop(self, address: str) -> None:
        assert address not in self._sources, f"{address} is current"
        self._info.pop(address, None)
        if not self._inflight.get(address):  # kept when a re-roled address still has requests on it
            self._inflight.pop(address, None)
        self._used.pop(address, None)
        self._stubs.pop(address, None)
        channel = self._channels.pop(address, None)
        if channel is not None:
            log.info("node dropped", address=address, role=self._roles[address])
            self._spawn(self._closing, channel.close(), f"close:{address}")

    def knows(self, address: str, role: str) -> bool:
        """Whether ``address`` is, or was, a node of ``role`` here (current or not)."""
        return self._roles.get(address) == role

    # --- channels ---

    def stub(self, address: str) -> Any:
        """The stub of the node's own service (PrefillNode, DecodeNode or CacheStore) on its one channel."""
        if address not in self._sources:  # a retired node still in use: keep its channel a while
            self._used[address] = time.monotonic()
        stub = self._stubs.get(address)
        if stub is not None and self._generation != identity_generation():
            self._renew_channels()
            stub = None
        if stub is None:
            tls_role = self._roles[address].replace("_", "-")  # the certificate's role name: cache-store
            channel = self._channels[address] = open_channel(address, tls_role, self._options)
            stub = self._stubs[address] = node_client.stub_for(self._roles[address], channel)
        return stub

    def _renew_channels(self) -> None:
        """This process's certificate was rotated: new calls open new channels with it; calls in flight
        finish on the old ones (closed with a long grace), whose certificate may soon expire."""
        self._generation = identity_generation()
        channels, self._channels, self._stubs = self._channels, {}, {}
        log.info("certificate rotated: reopening node channels", channels=len(channels))
        for address, channel in channels.items():
            self._spawn(self._closing, channel.close(grace=ROTATED_CHANNEL_GRACE_S), f"close:{address}")

    # --- status ---

    def nodes(self, role: str | None = None) -> list[NodeInfo]:
        """Every current node (of ``role``) as last polled, with this gateway's in-flight counts; a model
        node that serves another model than ``model`` (``model_check``), runs in another mode than
        ``deterministic`` (``mode_check``), or whose KV layout matches no healthy peer (``kv_compatibility``),
        is unhealthy (the first reason that applies: a node of another model or mode has another layout too)."""
        polled = [_with_inflight(self._info[a], self._inflight.get(a, 0)) for a in self._sources]
        every = with_kv_compatibility(with_mode_check(with_model_check(polled, self.model), self.deterministic))
        return [n for n in every if role is None or n.role == role]

    async def refresh(self) -> None:
        """Poll every current node now; concurrent callers share one round of calls."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._poll_all())
            self._refreshing.add_done_callback(self._refreshed)
        await asyncio.shield(self._refreshing)

    def _refreshed(self, future: asyncio.Future[None]) -> None:
        if self._refreshing is future:
            self._refreshing = None

    async def poll_node(self, address: str) -> None:
        """Poll ``address`` now: its health is then what it answers, or that it did not (within
        ``status_timeout_s``), whatever the last round said."""
        if address in self._roles:
            await self._poll(address)

    async def refresh_if_older(self, max_age_s: float) -> None:
        if time.monotonic() - self.last_refresh > max_age_s:
            await self.refresh()

    async def _poll_all(self) -> None:
        await asyncio.gather(*(self._poll(address) for address in list(self._sources)))
        self.last_refresh = time.monotonic()
        self._left_out.update(self.nodes())

    async def _poll(self, address: str) -> None:
        role = self._roles[address]
        peers = [n.address for n in self.nodes(DECODE) if n.healthy and n.address != address] if role == DECODE \
            else []  # a decode node's migration targets (NodeStatusRequest.decode_nodes)
        try:
            reported = await node_client.node_status(self.stub(address), address, self.status_timeout_s,
                                                     decode_nodes=peers)
        except grpc.aio.AioRpcError as error:
            self._set(NodeInfo(address=address, role=role, polled_at=time.monotonic(),
                               error=f"{error.code().name}: {error.details()}"))
            return
        self._set(node_info_from_status(role, reported, time.monotonic()))

    def _set(self, info: NodeInfo) -> None:
        was = self._info.get(info.address)
        if was is None or self._roles[info.address] != info.role:
            return  # dropped (or re-roled) while the call was out
        if was.healthy != info.healthy or (not info.healthy and info.error and not was.error):
            # a node that never became healthy is reported too, once, with the first reason known
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
        self._inflight[address] = self._inflight.get(address, 0) + 1

    def release(self, address: str) -> None:
        assert self._inflight.get(address, 0) > 0, f"release of {address} without a claim"
        self._inflight[address] -= 1
        if address in self._used:
            self._used[address] = time.monotonic()


def _with_inflight(info: NodeInfo, inflight: int) -> NodeInfo:
    return dataclasses.replace(info, inflight=inflight) if inflight else info

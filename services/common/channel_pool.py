"""One gRPC channel per peer address, opened on first use and closed once the peer is gone.

Prefill nodes talk to the decode nodes the gateway names, and decode nodes to their handover peers. With
DNS discovery those addresses come and go with pods, so a pool that only ever opened channels would keep
one (and its reconnect attempts) per address ever seen. A channel is closed when it has not been asked for
in ``idle_close_s`` and is either ``IDLE`` (gRPC's own state for "no call for a while") or
``TRANSIENT_FAILURE`` (the peer does not answer; calls on it fail anyway). A channel that carries a call
is ``READY`` or ``CONNECTING`` and is never closed here — except after this process's certificate was
rotated: the next ``stub()`` for a peer opens a new channel that presents the new certificate, and the old
one closes once its calls are done (at most ``ROTATED_CHANNEL_GRACE_S``). Sweeps run from ``stub()``, at
most once per ``sweep_interval_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio

from services.common.tls.channels import identity_generation, open_channel

S = TypeVar("S")

_CLOSABLE = (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.TRANSIENT_FAILURE)
ROTATED_CHANNEL_GRACE_S = 3600.0  # calls begun before a certificate rotation keep their old channel this long
_PENDING: set[asyncio.Task[None]] = set()  # keeps the background closes alive until they finish


@dataclass
class _Entry:
    channel: grpc.aio.Channel
    last_used: float
    generation: int = 0  # of this process's certificate files when the channel was opened


class ChannelPool:
    def __init__(self, role: str, options: Sequence[tuple[str, Any]] = (), *, idle_close_s: float = 300.0,
                 sweep_interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.role = role  # of the peers: their certificates are verified for it (tls.channels)
        self._options = list(options)
        self._entries: dict[str, _Entry] = {}
        self.idle_close_s = idle_close_s
        self.sweep_interval_s = sweep_interval_s
        self._clock = clock
        self._last_sweep = clock()
        self.closed_total = 0  # channels closed by sweeps

    def stub(self, address: str, stub_class: Callable[[grpc.aio.Channel], S]) -> S:
        """A stub of ``stub_class`` on the pooled channel to ``address``."""
        return stub_class(self.channel(address))

    def channel(self, address: str) -> grpc.aio.Channel:
        """The pooled channel to ``address`` (opened on first use, again after a certificate rotation)."""
        now = self._clock()
        if now - self._last_sweep >= self.sweep_interval_s:
            self.sweep(now)
        entry = self._entries.get(address)
        if entry is not None and entry.generation != identity_generation():
            del self._entries[address]  # this process's certificate was rotated: a new channel presents it
            _close_soon(entry.channel, ROTATED_CHANNEL_GRACE_S)
            entry = None
        if entry is None:
            entry = self._entries[address] = _Entry(open_channel(address, self.role, self._options), now,
                                                    identity_generation())
        entry.last_used = now
        return entry.channel

    def sweep(self, now: float | None = None) -> list[str]:
        """Close the channels of peers that are gone or unused (see the module docstring); returns their
        addresses. The close itself completes in the background."""
        now = self._clock() if now is None else now
        self._last_sweep = now
        gone = [address for address, entry in self._entries.items()
                if now - entry.last_used >= self.idle_close_s and entry.channel.get_state() in _CLOSABLE]
        for address in gone:
            channel = self._entries.pop(address).channel
            _close_soon(channel)
        self.closed_total += len(gone)
        return gone

    def addresses(self) -> list[str]:
        return list(self._entries)

    async def close(self) -> None:
        entries, self._entries = self._entries, {}
        for entry in entries.values():
            await entry.channel.close()


def _close_soon(channel: grpc.aio.Channel, grace: float | None = None) -> None:
    task = asyncio.get_running_loop().create_task(channel.close(grace))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)



"""Re-attaching a decode leg whose ``Attach`` call broke, so that a stall or a lost call costs latency, not
the stream.

A decode leg's call that fails ``UNAVAILABLE`` or ``CANCELLED`` without the node's ``pdserve-attach-final``
mark (``services.common.stream_close``: the node did not end it itself) lost its connection: this gateway
stood still past the keepalive timeout (a GC pause, SIGSTOP, a starved CPU), the network dropped it, or the
node hung or died. The decode node keeps a request whose call ended running, its tokens kept, for its
``--reattach-grace-s`` (default 30 s). So the leg waits a backoff, asks the node's ``NodeStatus`` (waiting
for a connection up to ``probe_timeout_s``), and when it answers opens ``Attach`` again with
``resume_after`` = the tokens this leg already read from the node: the stream goes on where it broke, no
gap, no duplicate. Each re-attach is logged; ``max_attempts`` re-attaches that break again before any
event end it.

When the gateway itself had just stood still (``Leg.stalled_s``), it keeps trying for ``window_s`` (the
nodes' default grace) or the request's deadline; otherwise a node that does not answer the probe is hung
or gone, and the leg fails at once as before (its original error).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import structlog

from services.common import keepalive
from services.common.stream_close import ended_by_node
from services.gateway import node_client
from services.gateway.legs import Break, Leg

log = structlog.get_logger(__name__)

BROKEN_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


@dataclass(frozen=True)
class ReattachPolicy:
    window_s: float = 30.0  # how long after the break to keep trying (after a stall of this gateway)
    first_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    probe_timeout_s: float = 2.0  # NodeStatus before each re-attach, a connection included
    max_attempts: int = 8  # re-attaches whose call broke again before any event


def broken_call(error: Exception) -> bool:
    """Whether ``error`` is a decode leg's call that broke (not one the node ended itself)."""
    return isinstance(error, grpc.aio.AioRpcError) and error.code() in BROKEN_CODES \
        and not ended_by_node(error.trailing_metadata())


class Reattacher:
    """``await reattacher(leg, error)``: True once ``leg.call`` is a new ``Attach`` resuming the stream;
    False to fail the leg (with ``leg.broken.error``, its first failure, when set)."""

    def __init__(self, stub: Callable[[str], Any], timeout: Callable[[], float | None],
                 metadata: Callable[[], Any], name: str, policy: ReattachPolicy = ReattachPolicy()) -> None:
        self._stub = stub
        self._timeout = timeout
        self._metadata = metadata
        self._policy = policy
        self._log = log.bind(request_id=name)

    async def __call__(self, leg: Leg, error: Exception) -> bool:
        if leg.ended or leg.finished or not broken_call(error):
            return False
        if leg.broken is None:
            stalled = leg.stalled_s >= keepalive.current().timeout_s
            leg.broken = Break(error, time.monotonic(), stalled, self._policy.first_backoff_s)
        broken = leg.broken
        give_up_at = broken.since + self._policy.window_s
        remaining = self._timeout()
        if remaining is not None:
            give_up_at = min(give_up_at, time.monotonic() + remaining)
        while not leg.ended:
            delay = broken.backoff_s
            if time.monotonic() + delay >= give_up_at or broken.attempts >= self._policy.max_attempts:
                self._log.warning("gave up re-attaching to the decode node", node=leg.address,
                                  attempts=broken.attempts, error=str(error))
                return False
            await asyncio.sleep(delay)
            broken.backoff_s = min(2 * delay, self._policy.max_backoff_s)
            if leg.ended:
                return False
            if not await self._answers(leg.address, give_up_at):
                if broken.gateway_stalled:
                    continue  # this gateway stood still: its connections may take a while to come back
                self._log.warning("the decode node does not answer after its Attach call broke: not re-attaching",
                                  node=leg.address, error=str(broken.error))
                return False
            broken.attempts += 1
            self._log.warning("re-attaching to the decode node after its Attach call broke", node=leg.address,
                              resume_after=leg.tokens, attempt=broken.attempts, gateway_stalled=broken.gateway_stalled,
                              error=str(error))
            leg.call = node_client.open_attach(self._stub(leg.address), leg.request_id, self._timeout(),
                                               self._metadata(), resume_after=leg.tokens)
            return True
        return False

    async def _answers(self, address: str, give_up_at: float) -> bool:
        timeout = min(self._policy.probe_timeout_s, max(0.01, give_up_at - time.monotonic()))
        try:
            await node_client.node_status(self._stub(address), address, timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError:
            return False
        return True

"""The two server streams of a request at the gateway (the prefill leg and the decode leg), read into one
queue, and what their failures become for the client.

A decode leg's pump also watches for ``moved_to`` (the node handed the request to another one) and tells
the flow at once, so that the adopter is attached to while the client may still be reading what came
before: an adopter that finishes with nobody attached keeps the tokens only for a while."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import structlog

from services.common import keepalive
from services.gateway.directory import NodeDirectory
from services.gateway.generation import NodeCallError
from services.gateway.nodes import PREFILL

log = structlog.get_logger(__name__)
STREAM_END = object()  # a leg's stream ended normally
Reattach = Callable[["Leg", Exception], Awaitable[bool]]
"""``(leg, error)``: True once ``leg.call`` resumes the broken stream (``reattach.Reattacher``)."""

@dataclass(eq=False)  # legs are told apart by identity: a request may come back to a node it left
class Leg:
    role: str
    address: str
    call: Any  # node_client.NodeStream: the call's events; cancel() cancels it
    request_id: str  # the request's id on that node (a retried request's attempt has an id of its own)
    pump: asyncio.Task[None] | None = None  # set once started
    finished: bool = False  # the node is done with the request: nothing to abort there
    ended: bool = False  # no more reading: the stream ended or was cancelled, the claim released
    successor: Leg | None = None  # the decode leg opened on this one's ``moved_to``, before the relay got there
    stalled_s: float = 0.0  # the gateway's own event loop had just stood still this long when the call failed
    tokens: int = 0  # token ids read from this node's streams (a re-attach resumes after them)
    broken: Break | None = None  # the call broke and the leg is re-attaching (``reattach``); None once it flows


@dataclass
class Break:
    """A decode leg's call broke: its first failure, when, and how the re-attaching goes."""

    error: Exception
    since: float  # time.monotonic()
    gateway_stalled: bool  # this gateway had just stood still past the keepalive timeout
    backoff_s: float
    attempts: int = 0


LegEvent = tuple[Leg | None, Any]
"""``(leg, item)``: an event of the leg's stream (``node_events``), an exception it failed with, or
``STREAM_END``; a ``None`` leg is a wake-up (the flow was cancelled)."""


async def pump_events(leg: Leg, queue: asyncio.Queue[LegEvent],
                      on_moved: Callable[[Leg, str], None] | None = None,
                      recent_stall: Callable[[], float] = lambda: 0.0, reattach: Reattach | None = None) -> None:
    """Read the leg's call into ``queue`` until it ends; a failure is queued, not raised (the relay raises
    it in the request's handler, maybe much later: a slow client paces it), with ``recent_stall()`` as it
    was when the call failed. ``on_moved(leg, address)`` is called on a ``moved_to`` as it arrives. A
    decode leg's ``reattach`` may replace a broken call with one that resumes it: the queue sees one
    stream; when it gives up, the first failure is queued."""
    while True:
        try:
            async for event in leg.call:
                if leg.broken is not None:
                    log.info("resumed the decode stream", node=leg.address, request_id=leg.request_id,
                             resume_after=leg.tokens, attempts=leg.broken.attempts)
                    leg.broken = None
                if reattach is not None:  # decode legs (TokenEvent)
                    leg.tokens += len(event.token_ids)
                queue.put_nowait((leg, event))
                if on_moved is not None and event.moved_to:  # on_moved: decode legs only (TokenEvent)
                    on_moved(leg, event.moved_to)
        except Exception as error:  # not swallowed: queued for the relay
            if leg.broken is None:
                leg.stalled_s = recent_stall()
            if reattach is not None and await reattach(leg, error):
                continue
            queue.put_nowait((leg, leg.broken.error if leg.broken is not None else error))
            return
        queue.put_nowait((leg, STREAM_END))
        return


def leg_failure(leg: Leg, error: grpc.aio.AioRpcError, directory: NodeDirectory) -> NodeCallError:
    """The client's status for a leg whose call failed. A prefill error keeps its code; a decode node that
    fails is UNAVAILABLE (and marked failed in the directory when it looks gone). When the gateway's own
    event loop had just stood still (``leg.stalled_s``) long enough for keepalive to give up (the keepalive
    timeout), a lost connection is said to be the gateway's doing and the node is not marked failed."""
    code, details = error.code(), error.details()
    lost = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    if lost and leg.stalled_s >= keepalive.current().timeout_s:
        return NodeCallError(grpc.StatusCode.UNAVAILABLE,
                             f"lost the call to {leg.role} node {leg.address} while this gateway stood still for "
                             f"{leg.stalled_s:.1f} s (paused or starved of CPU): {code.name}: {details}")
    if leg.role == PREFILL:
        if code == grpc.StatusCode.CANCELLED:  # not by us: the node went away
            code = grpc.StatusCode.UNAVAILABLE
        return NodeCallError(code, f"prefill node {leg.address}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return NodeCallError(code, f"decode node {leg.address}: {details}")
    if lost:
        directory.mark_failed(leg.address, f"Attach failed: {code.name}: {details}")
    return NodeCallError(grpc.StatusCode.UNAVAILABLE, f"decode node {leg.address} failed: {code.name}: {details}")

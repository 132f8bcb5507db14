"""The two server streams of a request at the gateway (the prefill leg and the decode leg), read into one
queue, and what their failures become for the client."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from services.gateway.directory import NodeDirectory
from services.gateway.generation import NodeCallError
from services.gateway.nodes import PREFILL

STREAM_END = object()  # a leg's stream ended normally

LegEvent = tuple[str, str, Any]
"""``(role, address, item)``: a message of the leg's stream, an exception it failed with, or
``STREAM_END``."""


@dataclass
class Leg:
    role: str
    address: str
    call: Any  # grpc.aio.UnaryStreamCall
    pump: asyncio.Task[None]
    finished: bool = False  # the node is done with the request: nothing to abort there
    ended: bool = False  # no more reading: the stream ended or was cancelled, the claim released


async def pump_events(role: str, address: str, call: Any, queue: asyncio.Queue[LegEvent]) -> None:
    """Read ``call`` into ``queue`` until it ends; a failure is queued, not raised (the relay raises it in
    the request's handler)."""
    try:
        async for message in call:
            queue.put_nowait((role, address, message))
    except Exception as error:  # not swallowed: queued for the relay
        queue.put_nowait((role, address, error))
        return
    queue.put_nowait((role, address, STREAM_END))


def leg_failure(leg: Leg, error: grpc.aio.AioRpcError, directory: NodeDirectory) -> NodeCallError:
    """The client's status for a leg whose call failed. A prefill error keeps its code; a decode node that
    fails is UNAVAILABLE (and marked failed in the directory when it looks gone)."""
    code, details = error.code(), error.details()
    if leg.role == PREFILL:
        if code == grpc.StatusCode.CANCELLED:  # not by us: the node went away
            code = grpc.StatusCode.UNAVAILABLE
        return NodeCallError(code, f"prefill node {leg.address}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return NodeCallError(code, f"decode node {leg.address}: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        directory.mark_failed(leg.address, f"Attach failed: {code.name}: {details}")
    return NodeCallError(grpc.StatusCode.UNAVAILABLE, f"decode node {leg.address} failed: {code.name}: {details}")

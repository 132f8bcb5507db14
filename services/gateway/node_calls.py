"""The calls one request has open to its nodes at the gateway: the prefill leg, the decode leg, and the
decode legs opened on handovers that the relay has not reached yet (``Leg.successor``).

:class:`NodeCalls` opens them (claiming the node in the directory, starting a pump that reads the call
into the request's queue), ends them (releasing the claim, cancelling the call when asked) and sends
``Abort`` to the nodes of unfinished ones. Every call runs under the current attempt's id on the nodes
(``attempts.py``) and carries the request's remaining time and trace context; its stream yields the
gateway's events (``node_events``), translated from the protos in ``node_client``. A decode leg whose pump
sees ``moved_to`` opens its successor on the adopter at once (:meth:`open_successor`), whether or not the
relay — paced by the client's reading — got there: an adopter that finishes with nobody attached keeps
the tokens only for a while. A decode leg whose call broke attaches again and resumes (``reattach.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry.context import Context

from services.common import tracing
from services.common.errors import UnavailableError
from services.gateway import node_client
from services.gateway.directory import NodeDirectory
from services.gateway.legs import Leg, LegEvent, pump_events
from services.gateway.node_events import PrefillCall
from services.gateway.nodes import DECODE, PREFILL
from services.gateway.reattach import Reattacher

Aborter = Callable[[str, str, str, str], Awaitable[None]]
"""``(role, address, request_id, reason)``: best-effort ``Abort`` of the request on that node."""


class NodeCalls:
    def __init__(self, directory: NodeDirectory, queue: asyncio.Queue[LegEvent], abort: Aborter,
                 attempt_id: Callable[[], str], timeout: Callable[[], float | None], trace: Context | None,
                 recent_stall: Callable[[], float], name: str) -> None:
        """``attempt_id()``: the id calls are opened under; ``timeout()``: the request's remaining time (None =
        no deadline); ``name``: the pumps' task names' suffix."""
        self.directory = directory
        self.queue = queue
        self._abort = abort
        self._attempt_id = attempt_id
        self._timeout = timeout
        self._trace = trace
        self._recent_stall = recent_stall
        self._name = name
        self.prefill: Leg | None = None
        self.decode: Leg | None = None
        self.closed = False  # no more legs are opened (the request ended)
        self._reattach = Reattacher(directory.stub, timeout, lambda: tracing.outgoing(trace), name)

    def all(self) -> list[Leg]:
        """The prefill leg, the decode leg, and the decode legs opened on handovers not relayed yet."""
        legs = [leg for leg in (self.prefill, self.decode) if leg is not None]
        successor = self.decode.successor if self.decode is not None else None
        while successor is not None:
            legs.append(successor)
            successor = successor.successor
        return legs

    def is_live(self, leg: Leg) -> bool:
        return not leg.ended and any(leg is live for live in self.all())

    # --- opening ---

    def open_prefill(self, address: str, request: PrefillCall) -> Leg:
        call = node_client.open_prefill(self.directory.stub(address), request, self._timeout(),
                                        tracing.outgoing(self._trace))
        self.prefill = self._start(PREFILL, address, call)
        return self.prefill

    def open_decode(self, address: str, why: str) -> Leg:
        """``Attach`` on ``address`` as the decode leg; ``UNAVAILABLE`` (``why``…) if it is no decode node
        of this gateway."""
        if not self.directory.knows(address, DECODE):
            raise UnavailableError(f"{why}, which is not a decode node of this gateway")
        self.decode = self._attach(address)
        return self.decode

    def open_successor(self, leg: Leg, address: str) -> None:
        """``leg``'s pump saw ``moved_to``: attach to the adopter now. Its events queue behind the old
        leg's; the relay moves to it when it gets there (an unknown node is refused then)."""
        if self.closed or leg.ended or leg.successor is not None or not self.directory.knows(address, DECODE):
            return
        leg.finished = True  # handed over: nothing is left to abort on that node
        leg.successor = self._attach(address)

    def _attach(self, address: str) -> Leg:
        call = node_client.open_attach(self.directory.stub(address), self._attempt_id(), self._timeout(),
                                       tracing.outgoing(self._trace))
        return self._start(DECODE, address, call)

    def _start(self, role: str, address: str, call: node_client.NodeStream[Any]) -> Leg:
        self.directory.claim(address)
        leg = Leg(role, address, call, self._attempt_id())
        moved = self.open_successor if role == DECODE else None
        reattach = self._reattach if role == DECODE else None
        leg.pump = asyncio.create_task(pump_events(leg, self.queue, moved, self._recent_stall, reattach),
                                       name=f"{role}:{self._name}")
        return leg

    # --- ending ---

    def end(self, leg: Leg, cancel: bool) -> None:
        """No more reading from ``leg``: release its claim; ``cancel`` its call too."""
        if leg.ended:
            return
        leg.ended = True
        if cancel:
            if leg.pump is not None:
                leg.pump.cancel()
            leg.call.cancel()
        self.directory.release(leg.address)

    def end_all(self) -> list[Leg]:
        """End every leg (cancelling the unfinished ones' calls); the unfinished ones, to abort."""
        legs = self.all()
        for leg in legs:
            self.end(leg, cancel=not leg.finished)
        return [leg for leg in legs if not leg.finished]

    async def abort(self, legs: Sequence[Leg], reason: str) -> None:
        """``Abort`` on each leg's node, under the id the leg ran under (they carry an ``abort`` span)."""
        with tracing.span("abort", self._trace, nodes=len(legs), reason=reason):
            await asyncio.gather(*(self._abort(leg.role, leg.address, leg.request_id, reason) for leg in legs))

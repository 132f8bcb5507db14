"""Where one request's legs run at the gateway, and where the request goes when a node fails it.

:class:`LegPlacement` routes the request (a fresh directory poll when no healthy pair is known), opens
the prefill leg (the nodes get the token-level sampling only: stop strings are the gateway's), attaches
the decode leg where the prefill node reserved, and follows a decode node's ``moved_to`` to the adopter.
When a node fails the request it decides what comes next:

- before the first token reached the client: start over on other nodes under a new id on the nodes, while
  a retry is left and the failure may be the node's (``attempts.py``);
- after it: go on, recomputed, on another decode node while a resume is left (``resume.py``).

The aborts of a failed attempt's legs are tasks in ``background_aborts``: the flow hands those still
running to its owner at close, so the request id stays taken until they end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence

import structlog
from opentelemetry.context import Context

from services.common import tracing
from services.gateway.attempts import Attempts
from services.gateway.directory import NodeDirectory
from services.gateway.generation import PreparedRequest
from services.gateway.legs import Leg
from services.gateway.node_calls import NodeCalls
from services.gateway.node_events import PrefillCall
from services.gateway.nodes import DECODE, PREFILL
from services.gateway.resume import adopt_elsewhere, resumable
from services.gateway.router import NoHealthyNodeError, Router

log = structlog.get_logger(__name__)

Route = tuple[str, tuple[str, ...]]
"""``(prefill node, decode candidates)``."""


class LegPlacement:
    def __init__(self, request: PreparedRequest, *, directory: NodeDirectory, router: Router, calls: NodeCalls,
                 attempts: Attempts, resumes: int, on_retry: Callable[[str], None],
                 timeout: Callable[[], float | None], check_open: Callable[[], None], trace: Context | None) -> None:
        """``calls``: the request's calls to its nodes; ``attempts``: its retries left and the id it runs
        under on the nodes; ``resumes``: how many times it may go on on another decode node after the first
        token; ``on_retry(role of the failed node)``: called on each retry and resume; ``timeout()``: the
        request's remaining time (None = no deadline); ``check_open()``: raises once the flow was closed."""
        self.request = request
        self.directory = directory
        self.router = router
        self.calls = calls
        self.attempts = attempts
        self.resumes_left = resumes
        self.background_aborts: list[asyncio.Task[None]] = []  # failed attempts' aborts (awaited at close)
        self._on_retry = on_retry
        self._timeout = timeout
        self._check_open = check_open
        self._trace = trace
        self.log = log.bind(request_id=request.request_id)

    # --- starting the legs ---

    async def route(self) -> Route:
        try:
            return self.pick()
        except NoHealthyNodeError:
            await self.directory.refresh()  # a node may have come back since the last poll
            return self.pick()

    def pick(self, exclude: frozenset[str] = frozenset()) -> Route:
        prefill, decode = ([node for node in self.directory.nodes(role) if node.address not in exclude]
                           for role in (PREFILL, DECODE))
        route = self.router.route(prefill, decode, self.request.prompt_ids)
        return route.prefill, route.decode_candidates

    def start_prefill(self, address: str, candidates: tuple[str, ...]) -> None:
        # Stop strings are the gateway's (it detokenizes); the nodes get the token-level settings only.
        sampling = dataclasses.replace(self.request.sampling, stop=())
        request = PrefillCall(self.attempts.attempt_id, self.request.prompt_ids, sampling, candidates,
                              deadline_unix_ms=self.deadline_unix_ms())
        self.log.debug("prefill", node=address, candidates=candidates)
        self.calls.open_prefill(address, request)

    def attach(self, address: str) -> None:
        """The prefill node reserved on ``address``: the decode leg is there."""
        old = self.calls.decode
        if old is not None:
            if old.address == address:
                return
            self.log.warning("prefill node moved the request", from_node=old.address, to_node=address)
            self.calls.end(old, cancel=True)
        prefill = self.calls.prefill.address if self.calls.prefill is not None else ""
        self.calls.open_decode(address, f"prefill node {prefill}: reserved on {address}")

    def move(self, leg: Leg, address: str) -> None:
        """The decode node handed the request to another one (``moved_to``): relay from there on. The old
        stream ends by itself and nothing is left to abort on its node."""
        self.log.info("decode node handed the request over", from_node=leg.address, to_node=address)
        leg.finished = True
        self.calls.end(leg, cancel=False)
        if leg.successor is not None and leg.successor.address == address:
            self.calls.decode = leg.successor
        else:
            self.calls.open_decode(address, f"decode node {leg.address}: moved the request to {address}")

    # --- when a node fails the request ---

    async def start_over(self, failed: Leg, failure: Exception) -> bool:
        """A leg failed before the first token: if the failure may be the node's (``UNAVAILABLE``: gone,
        hung past keepalive, draining, its stream cut) and a retry is left, abort this attempt everywhere
        (answered, so that its blocks are free) and run the request again on nodes other than the failed
        one, under a new id on the nodes (``attempts.py``). A prefill failure while the decode leg's
        stream has ended too is the decode node's: the prefill node reported losing it; and when no other
        prefill node is healthy, the same one is tried again if it answers a status poll now (the last
        round may predate its hang: a retry sent to a stopped process waited ~20 s to connect)."""
        if self._timeout() == 0.0 or not self.attempts.may_retry(failure):
            return False
        decode = self.calls.decode
        if failed.role == PREFILL and decode is not None and not decode.finished and decode.pump is not None \
                and decode.pump.done():
            failed = decode
        try:
            route = self.pick(exclude=self.attempts.failed_nodes | {failed.address})
        except NoHealthyNodeError:  # no other node of that role
            if failed.role != PREFILL:
                return False  # the client hears the failure itself
            await self.directory.poll_node(failed.address)  # a hung or dead one is unhealthy after this
            try:  # the prefill node may have reported a decode node's failure: it may serve the retry
                route = self.pick(exclude=self.attempts.failed_nodes)
            except NoHealthyNodeError:
                return False
        self.log.warning("a node failed the request before its first token; running it again elsewhere",
                         role=failed.role, failed_node=failed.address, error=str(failure), prefill_node=route[0],
                         attempt=len(self.attempts.failed_nodes) + 1)
        legs = self.calls.end_all()
        self.calls.prefill = self.calls.decode = None  # a cancel meanwhile has nothing more to abort
        reason = f"the gateway: {failed.role} node {failed.address} failed; the request runs elsewhere"
        # The failed node may never answer (hung): its Abort goes in the background, unless the new attempt
        # runs there too. The others' are answered first, so their blocks are free for the new attempt.
        # Either way they are tasks the flow hands its owner at close: the request id stays taken until
        # they end, and a cancel meanwhile does not lose them.
        waited = [leg for leg in legs if leg.address != failed.address or leg.address == route[0]]
        background = [leg for leg in legs if leg not in waited]
        if background:
            self.background_aborts.append(asyncio.ensure_future(self.calls.abort(background, reason)))
        if waited:
            answered = asyncio.ensure_future(self.calls.abort(waited, reason))
            self.background_aborts.append(answered)
            await asyncio.shield(answered)
        self._check_open()
        self.attempts.next_attempt(failed.address)
        self._on_retry(failed.role)
        self.log.info("attempt started", attempt_id=self.attempts.attempt_id)
        self.start_prefill(*route)
        return True

    async def resume(self, failed: Leg, failure: Exception, generated: Sequence[int]) -> bool:
        """The decode leg failed after the first token (``generated``: every token the nodes sent): go on,
        recomputed, on another decode node if a resume is left and the failure may be the node's
        (``resume.py``); True once attached there."""
        if failed.role != DECODE or self.resumes_left == 0 or self._timeout() == 0.0 or not resumable(failure):
            return False
        self.calls.end(failed, cancel=True)
        if not failed.finished:  # it may hold the request still (hung, cut off): in the background
            reason = f"the gateway: decode node {failed.address} failed; the request goes on elsewhere"
            self.background_aborts.append(asyncio.ensure_future(self.calls.abort([failed], reason)))
        self.resumes_left -= 1
        self.attempts.failed_nodes |= {failed.address}
        address = await adopt_elsewhere(self.directory, self.attempts.attempt_id, self.request, generated,
                                        self.attempts.failed_nodes, self.deadline_unix_ms(), self._timeout() or 10.0,
                                        tracing.outgoing(self._trace))
        self._check_open()
        if address is None:
            self.log.warning("no other decode node took the request", failed_node=failed.address)
            return False
        self.log.warning("a decode node failed the request mid-stream; it goes on, recomputed, on another",
                         failed_node=failed.address, decode_node=address, error=str(failure),
                         tokens=len(generated))
        self._on_retry(DECODE)
        self.calls.open_decode(address, f"resumed on {address}")
        return True

    def deadline_unix_ms(self) -> int:
        """The request's deadline as the nodes get it (0 = none)."""
        remaining = self._timeout()
        return 0 if remaining is None else int((time.time() + remaining) * 1000)

"""One Generate call at the gateway: route it, run the prefill leg and the decode leg, relay the tokens.

``RequestFlow.run()`` yields ``GenerateChunk``s: the first token (from the prefill node's ``first_token``
event), then the decode node's tokens with their incremental text, the last chunk carrying
``finish_reason`` and ``usage``. The two legs are server streams read concurrently into one queue:

- prefill leg: ``PrefillNode.Prefill`` → ``refused``* ``reserved`` ``first_token`` ``done``. On
  ``reserved`` the decode leg starts at once; decode events that arrive before ``first_token`` wait.
- decode leg: ``DecodeNode.Attach`` → ``TokenEvent``s, the last with ``finish_reason``. A stream that
  ends without one, or fails, is the decode node failing (``UNAVAILABLE``), never a hang. A last event
  with ``moved_to`` (the request was preempted there and handed to another decode node) ends that leg
  as finished and relays from ``Attach`` on the node named, opened as soon as the ``moved_to`` arrived
  (not when the client has read up to it: a slow reader would find the adopter had dropped the tokens of
  a request nobody attached to): the client sees one stream of tokens.

A prefill error keeps its status code (the message names the node). Stop strings are matched here and
not sent to the nodes: a match ends the request with ``finish_reason = "stop"`` and an ``Abort`` to the
decode node. ``cancel()`` (client gone, deadline,
drain) and any failure cancel both calls and send ``Abort`` to every node whose leg had not finished.

Which nodes the legs run on, and where the request goes when a node fails it (start over before the first
token, resume after it), is ``leg_placement.py``'s; the tokens, text and timing of what the client was sent
are ``client_output.py``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
import structlog

from services.common import tracing
from services.common.errors import UnavailableError, mapped_errors, status_of
from services.engine.logprobs import TokenLogprobs
from services.engine.tokenizer import Tokenizer
from services.gateway.attempts import Attempts
from services.gateway.client_output import ClientOutput
from services.gateway.directory import NodeDirectory
from services.gateway.generation import GenerateChunk, PreparedRequest
from services.gateway.leg_placement import LegPlacement
from services.gateway.legs import STREAM_END, Leg, LegEvent, leg_failure
from services.gateway.node_calls import Aborter, NodeCalls
from services.gateway.node_events import FirstToken, PrefillDone, Refused, Reserved
from services.gateway.nodes import DECODE, PREFILL
from services.gateway.resume import DecodeAbortError
from services.gateway.router import NoHealthyNodeError, Router

log = structlog.get_logger(__name__)


CloseHook = Callable[["RequestFlow", "Awaitable[None] | None"], None]
"""Called once when the flow ends, with the aborts still to send (or None): the owner runs them in the
background and forgets the request id only after they are done."""


class RequestFlow:
    def __init__(self, request: PreparedRequest, *, directory: NodeDirectory, router: Router,
                 tokenizer: Tokenizer, deadline: float | None, abort: Aborter, on_close: CloseHook,
                 recent_stall: Callable[[], float] = lambda: 0.0, retries: int = 0,
                 on_retry: Callable[[str], None] = lambda role: None, fresh_id: bool = False, resumes: int = 0) -> None:
        """``deadline``: the ``time.monotonic()`` by which the request must end (None = none);
        ``recent_stall()``: seconds of a stall of the gateway's own event loop that just ended;
        ``retries``: how many times the request may start over on other nodes when one fails before the
        first token (``on_retry(role of the failed node)`` is called each time); ``fresh_id``: run even the
        first attempt under an id of its own on the nodes (``attempts.py``); ``resumes``: how many times it
        may go on, recomputed, on another decode node when its decode node fails after the first token
        (``resume.py``)."""
        self.request = request
        self.directory = directory
        self.router = router
        self.deadline = deadline
        self._on_close = on_close
        attempts = Attempts(request.request_id, retries, fresh_first=fresh_id)
        self._queue: asyncio.Queue[LegEvent] = asyncio.Queue()
        self._closed = False
        self._cancel_reason = "request closed"
        self.log = log.bind(request_id=request.request_id)
        if fresh_id:
            self.log.info("the id's last Abort got no answer: this request runs under a fresh id on the nodes",
                          attempt_id=attempts.attempt_id)
        self._trace = tracing.current_context()  # the Generate span: parent of this flow's spans and calls
        self._calls = NodeCalls(directory, self._queue, abort, lambda: attempts.attempt_id, self._timeout,
                                self._trace, recent_stall, request.request_id)
        self._legs = LegPlacement(request, directory=directory, router=router, calls=self._calls, attempts=attempts,
                                  resumes=resumes, on_retry=on_retry, timeout=self._timeout,
                                  check_open=self._check_open, trace=self._trace)
        self._output = ClientOutput(request, tokenizer, self._trace)  # the flow opens: tokenized and valid

    @property
    def request_id(self) -> str:
        return self.request.request_id

    # --- lifecycle ---

    async def run(self) -> AsyncIterator[GenerateChunk]:
        try:
            with tracing.span("route", self._trace):
                route = await self._legs.route()
            self._check_open()
            self._legs.start_prefill(*route)
            async for chunk in self._relay():
                yield chunk
        except Exception as error:
            if not self._closed:  # a cancelled request was logged as such
                code = status_of(error).name if isinstance(error, mapped_errors()) else type(error).__name__
                why = {"nodes": error.reasons} if isinstance(error, NoHealthyNodeError) else {}  # kept from clients
                self.log.info("request failed", code=code, error=str(error), duration_ms=self._output.elapsed_ms(),
                              **why)
            raise
        except asyncio.CancelledError:  # the call was cancelled or its deadline passed
            if not self._closed:
                self.log.info("request cancelled", reason="the client cancelled the call or its deadline passed",
                              duration_ms=self._output.elapsed_ms())
            raise
        finally:
            self.close()

    def cancel(self, reason: str) -> None:
        """Stop now (client gone, deadline passed, gateway draining). Safe at any time, repeatedly."""
        if not self._closed:
            self.log.info("request cancelled", reason=reason, duration_ms=self._output.elapsed_ms())
            self._cancel_reason = reason
            self._queue.put_nowait((None, reason))
            self.close()

    def close(self) -> None:
        """Stop reading both legs; every node whose leg had not finished gets an ``Abort``. Idempotent."""
        if self._closed:
            return
        self._closed = self._calls.closed = True
        self._output.end_detokenize()
        unfinished = self._calls.end_all()
        aborts = self._calls.abort(unfinished, "the gateway: the request ended early there") if unfinished else None
        pending = [task for task in self._legs.background_aborts if not task.done()]
        if pending:
            aborts = _all(aborts, *pending)
        self._on_close(self, aborts)

    # --- relaying ---

    async def _relay(self) -> AsyncIterator[GenerateChunk]:
        early: list[tuple[Leg, Any]] = []  # decode events that came before the first token
        while True:
            leg, item = await self._queue.get()
            self._check_open()
            if leg is None or not self._calls.is_live(leg):
                continue  # a decode node the request moved away from, or a failed attempt's
            if isinstance(item, Exception) or (leg.role == PREFILL and item is STREAM_END
                                               and not self._output.first_sent):
                self._calls.end(leg, cancel=False)
                if item is not STREAM_END and not isinstance(item, grpc.aio.AioRpcError):
                    raise item
                if leg.finished:
                    continue  # the node had done its part; its stream's end does not matter
                failure = leg_failure(leg, item, self.directory) if item is not STREAM_END else UnavailableError(
                    f"prefill node {leg.address}: stream ended before the first token")
                if not self._output.first_sent and await self._legs.start_over(leg, failure):
                    early.clear()  # the failed attempt's decode events
                    continue
                if self._output.first_sent and await self._legs.resume(leg, failure, self._output.generated):
                    continue
                raise failure
            if leg.role == DECODE and not self._output.first_sent:
                early.append((leg, item))
                continue
            due = [(leg, item)]
            while due:
                event_leg, event = due.pop(0)
                if event_leg.role == DECODE and event_leg is not self._calls.decode:
                    continue  # the request moved away from that decode node meanwhile
                try:
                    chunk = await (self._on_prefill(event_leg, event) if event_leg.role == PREFILL
                                   else self._on_decode(event_leg, event))
                except UnavailableError as failure:  # a decode node's stream ended early or it aborted
                    if event_leg.role == DECODE and self._output.first_sent \
                            and await self._legs.resume(event_leg, failure, self._output.generated):
                        break
                    raise
                if chunk is not None:
                    yield chunk
                    if chunk.finish_reason:
                        self._output.log_finish(self.log, chunk, self._prefill_address, self._decode_address)
                        return
                if self._output.first_sent and early:  # the first token just went: the decode events held back follow
                    due[:0], early = early, []

    async def _on_prefill(self, leg: Leg, item: Any) -> GenerateChunk | None:
        if item is STREAM_END:  # after the first token (before it, the relay handles it as a failure)
            self._calls.end(leg, cancel=False)
            leg.finished = True
            return None
        if isinstance(item, Refused):
            self.log.info("decode node refused", node=item.decode_address, reason=item.reason)
        elif isinstance(item, Reserved):
            self._legs.attach(item.decode_address)
        elif isinstance(item, PrefillDone):
            leg.finished = True
        elif isinstance(item, FirstToken) and not self._output.first_sent:
            return await self._on_first_token(leg, item)
        return None

    async def _on_first_token(self, leg: Leg, first: FirstToken) -> GenerateChunk | None:
        if first.finish_reason:
            # The prefill node ends the request itself, its reservation on the decode node included.
            leg.finished = True
            if (decode := self._calls.decode) is not None:
                decode.finished = True
                self._calls.end(decode, cancel=True)
        elif self._calls.decode is None:
            raise UnavailableError(f"prefill node {leg.address}: first token before a reservation")
        expected = len(self.request.prompt_ids) - 1
        if self.request.sampling.prompt_logprobs is not None and len(first.prompt_logprobs) != expected:
            raise UnavailableError(f"prefill node {leg.address} returned {len(first.prompt_logprobs)} prompt "
                                   f"logprobs for a prompt of {expected + 1} tokens (a node of an earlier version?)")
        self._output.first_token(first.cached_tokens)
        logprobs = [first.logprob] if first.logprob is not None else []
        return await self._chunk([first.token_id], first.finish_reason, first=True, logprobs=logprobs,
                                 prompt_logprobs=first.prompt_logprobs)

    async def _on_decode(self, leg: Leg, item: Any) -> GenerateChunk | None:
        if item is STREAM_END:
            self._calls.end(leg, cancel=False)
            raise UnavailableError(f"decode node {leg.address} failed: its stream ended without a finish reason")
        if item.moved_to:
            self._legs.move(leg, item.moved_to)
            return await self._chunk(item.token_ids, "", logprobs=item.logprobs) if item.token_ids else None
        if item.finish_reason == "abort":  # the node gave up on it (lease expired, draining, its prefill node's)
            leg.finished = True
            raise DecodeAbortError(leg.address, item.abort_reason)
        if item.finish_reason:
            leg.finished = True
            if self._calls.prefill is not None:
                self._calls.prefill.finished = True  # the decode node had the KV committed: prefill's part is over
        return await self._chunk(item.token_ids, item.finish_reason, logprobs=item.logprobs)

    async def _chunk(self, token_ids: Sequence[int], finish_reason: str, first: bool = False,
                     logprobs: Sequence[TokenLogprobs] = (), prompt_logprobs: Sequence[TokenLogprobs] = ()
                     ) -> GenerateChunk | None:
        delta = self._output.add(token_ids, finish_reason, first)
        if delta.stop_matched is not None:
            await self._stop_unfinished_legs(f"stop string {delta.stop_matched!r}")
        return self._output.chunk(delta, logprobs, prefill_node=self._prefill_address if first else "",
                                  decode_node=self._decode_address if first else "", prompt_logprobs=prompt_logprobs)

    async def _stop_unfinished_legs(self, reason: str) -> None:
        """The gateway ended the request (stop string): cancel the legs still running and wait for their
        nodes to confirm the abort, so the request id is free everywhere before the client hears."""
        legs = [leg for leg in self._calls.all() if not leg.finished]
        for leg in legs:
            leg.finished = True
            self._calls.end(leg, cancel=True)
        await self._calls.abort(legs, reason)

    # --- helpers ---

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError(f"request {self.request_id!r} cancelled: {self._cancel_reason}")

    @property
    def _prefill_address(self) -> str:
        return self._calls.prefill.address if self._calls.prefill is not None else ""

    @property
    def _decode_address(self) -> str:
        return self._calls.decode.address if self._calls.decode is not None else ""

    def _timeout(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


async def _all(*aborts: Awaitable[None] | None) -> None:
    for result in await asyncio.gather(*(abort for abort in aborts if abort is not None), return_exceptions=True):
        if isinstance(result, Exception):
            log.error("an abort failed", error=repr(result))

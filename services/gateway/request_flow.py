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
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
import structlog
from opentelemetry.trace import Span

from services.common import tracing
from services.common.errors import UnavailableError, mapped_errors, status_of
from services.engine.logprobs import TokenLogprobs
from services.engine.tokenizer import Tokenizer
from services.gateway.attempts import Attempts
from services.gateway.completion_text import CompletionText
from services.gateway.directory import NodeDirectory
from services.gateway.generation import GenerateChunk, PreparedRequest
from services.gateway.legs import STREAM_END, Leg, LegEvent, leg_failure
from services.gateway.node_calls import Aborter, NodeCalls
from services.gateway.node_events import FirstToken, PrefillCall, PrefillDone, Refused, Reserved
from services.gateway.nodes import DECODE, PREFILL
from services.gateway.resume import DecodeAbortError, adopt_elsewhere, resumable
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
        self._attempts = Attempts(request.request_id, retries, fresh_first=fresh_id)
        self._background_aborts: list[asyncio.Task[None]] = []  # failed attempts' aborts (awaited at close)
        self._on_retry = on_retry
        self._resumes_left = resumes
        self._generated: list[int] = []  # every token the nodes sent (a resume hands them over)
        self._text = CompletionText(tokenizer, request.sampling.stop, len(request.prompt_ids),
                                    request.sampling.min_tokens)
        self._queue: asyncio.Queue[LegEvent] = asyncio.Queue()
        self._first_sent = False
        self._closed = False
        self._cancel_reason = "request closed"
        self.log = log.bind(request_id=request.request_id)
        if fresh_id:
            self.log.info("the id's last Abort got no answer: this request runs under a fresh id on the nodes",
                          attempt_id=self._attempts.attempt_id)
        self._trace = tracing.current_context()  # the Generate span: parent of this flow's spans and calls
        self._calls = NodeCalls(directory, self._queue, abort, lambda: self._attempts.attempt_id, self._timeout,
                                self._trace, recent_stall, request.request_id)
        self._detokenize: Span | None = None  # from the first token to the end (not a span per token)
        self._started = time.monotonic()  # the flow opens once the request is tokenized and valid
        self._first_token_at: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    # --- lifecycle ---

    async def run(self) -> AsyncIterator[GenerateChunk]:
        try:
            with tracing.span("route", self._trace):
                route = await self._route()
            self._check_open()
            self._start_prefill(*route)
            async for chunk in self._relay():
                yield chunk
        except Exception as error:
            if not self._closed:  # a cancelled request was logged as such
                code = status_of(error).name if isinstance(error, mapped_errors()) else type(error).__name__
                self.log.info("request failed", code=code, error=str(error), duration_ms=self._elapsed_ms())
            raise
        except asyncio.CancelledError:  # the call was cancelled or its deadline passed
            if not self._closed:
                self.log.info("request cancelled", reason="the client cancelled the call or its deadline passed",
                              duration_ms=self._elapsed_ms())
            raise
        finally:
            self.close()

    def cancel(self, reason: str) -> None:
        """Stop now (client gone, deadline passed, gateway draining). Safe at any time, repeatedly."""
        if not self._closed:
            self.log.info("request cancelled", reason=reason, duration_ms=self._elapsed_ms())
            self._cancel_reason = reason
            self._queue.put_nowait((None, reason))
            self.close()

    def close(self) -> None:
        """Stop reading both legs; every node whose leg had not finished gets an ``Abort``. Idempotent."""
        if self._closed:
            return
        self._closed = self._calls.closed = True
        self._end_detokenize()
        unfinished = self._calls.end_all()
        aborts = self._calls.abort(unfinished, "the gateway: the request ended early there") if unfinished else None
        pending = [task for task in self._background_aborts if not task.done()]
        if pending:
            aborts = _all(aborts, *pending)
        self._on_close(self, aborts)

    # --- starting the legs ---

    async def _route(self) -> tuple[str, tuple[str, ...]]:
        try:
            return self._pick()
        except NoHealthyNodeError:
            await self.directory.refresh()  # a node may have come back since the last poll
            return self._pick()

    def _pick(self, exclude: frozenset[str] = frozenset()) -> tuple[str, tuple[str, ...]]:
        prefill, decode = ([node for node in self.directory.nodes(role) if node.address not in exclude]
                           for role in (PREFILL, DECODE))
        route = self.router.route(prefill, decode, self.request.prompt_ids)
        return route.prefill, route.decode_candidates

    def _start_prefill(self, address: str, candidates: tuple[str, ...]) -> None:
        # Stop strings are the gateway's (it detokenizes); the nodes get the token-level settings only.
        sampling = dataclasses.replace(self.request.sampling, stop=())
        request = PrefillCall(self._attempts.attempt_id, self.request.prompt_ids, sampling, candidates,
                              deadline_unix_ms=self._deadline_unix_ms())
        self.log.debug("prefill", node=address, candidates=candidates)
        self._calls.open_prefill(address, request)

    def _attach(self, address: str) -> None:
        """The prefill node reserved on ``address``: the decode leg is there."""
        old = self._calls.decode
        if old is not None:
            if old.address == address:
                return
            self.log.warning("prefill node moved the request", from_node=old.address, to_node=address)
            self._calls.end(old, cancel=True)
        self._calls.open_decode(address, f"prefill node {self._prefill_address}: reserved on {address}")

    def _move(self, leg: Leg, address: str) -> None:
        """The decode node handed the request to another one (``moved_to``): relay from there on. The old
        stream ends by itself and nothing is left to abort on its node."""
        self.log.info("decode node handed the request over", from_node=leg.address, to_node=address)
        leg.finished = True
        self._calls.end(leg, cancel=False)
        if leg.successor is not None and leg.successor.address == address:
            self._calls.decode = leg.successor
        else:
            self._calls.open_decode(address, f"decode node {leg.address}: moved the request to {address}")

    async def _start_over(self, failed: Leg, failure: Exception) -> bool:
        """A leg failed before the first token: if the failure may be the node's (``UNAVAILABLE``: gone,
        hung past keepalive, draining, its stream cut) and a retry is left, abort this attempt everywhere
        (answered, so that its blocks are free) and run the request again on nodes other than the failed
        one, under a new id on the nodes (``attempts.py``). A prefill failure while the decode leg's
        stream has ended too is the decode node's: the prefill node reported losing it; and when no other
        prefill node is healthy, the same one is tried again if it answers a status poll now (the last
        round may predate its hang: a retry sent to a stopped process waited ~20 s to connect)."""
        if self._first_sent or self._timeout() == 0.0 or not self._attempts.may_retry(failure):
            return False
        decode = self._calls.decode
        if failed.role == PREFILL and decode is not None and not decode.finished and decode.pump is not None \
                and decode.pump.done():
            failed = decode
        try:
            route = self._pick(exclude=self._attempts.failed_nodes | {failed.address})
        except NoHealthyNodeError:  # no other node of that role
            if failed.role != PREFILL:
                return False  # the client hears the failure itself
            await self.directory.poll_node(failed.address)  # a hung or dead one is unhealthy after this
            try:  # the prefill node may have reported a decode node's failure: it may serve the retry
                route = self._pick(exclude=self._attempts.failed_nodes)
            except NoHealthyNodeError:
                return False
        self.log.warning("a node failed the request before its first token; running it again elsewhere",
                         role=failed.role, failed_node=failed.address, error=str(failure), prefill_node=route[0],
                         attempt=len(self._attempts.failed_nodes) + 1)
        legs = self._calls.end_all()
        self._calls.prefill = self._calls.decode = None  # a cancel meanwhile has nothing more to abort
        reason = f"the gateway: {failed.role} node {failed.address} failed; the request runs elsewhere"
        # The failed node may never answer (hung): its Abort goes in the background, unless the new attempt
        # runs there too. The others' are answered first, so their blocks are free for the new attempt.
        # Either way they are tasks the flow hands its owner at close: the request id stays taken until
        # they end, and a cancel meanwhile does not lose them.
        waited = [leg for leg in legs if leg.address != failed.address or leg.address == route[0]]
        background = [leg for leg in legs if leg not in waited]
        if background:
            self._background_aborts.append(asyncio.ensure_future(self._calls.abort(background, reason)))
        if waited:
            answered = asyncio.ensure_future(self._calls.abort(waited, reason))
            self._background_aborts.append(answered)
            await asyncio.shield(answered)
        self._check_open()
        self._attempts.next_attempt(failed.address)
        self._on_retry(failed.role)
        self.log.info("attempt started", attempt_id=self._attempts.attempt_id)
        self._start_prefill(*route)
        return True

    async def _resume(self, failed: Leg, failure: Exception) -> bool:
        """The decode leg failed after the first token: go on, recomputed, on another decode node if a
        resume is left and the failure may be the node's (``resume.py``); True once attached there."""
        if not self._first_sent or failed.role != DECODE or self._resumes_left == 0 or self._timeout() == 0.0 \
                or not resumable(failure):
            return False
        self._calls.end(failed, cancel=True)
        if not failed.finished:  # it may hold the request still (hung, cut off): in the background
            reason = f"the gateway: decode node {failed.address} failed; the request goes on elsewhere"
            self._background_aborts.append(asyncio.ensure_future(self._calls.abort([failed], reason)))
        self._resumes_left -= 1
        self._attempts.failed_nodes |= {failed.address}
        address = await adopt_elsewhere(self.directory, self._attempts.attempt_id, self.request, self._generated,
                                        self._attempts.failed_nodes, self._deadline_unix_ms(), self._timeout() or 10.0,
                                        tracing.outgoing(self._trace))
        self._check_open()
        if address is None:
            self.log.warning("no other decode node took the request", failed_node=failed.address)
            return False
        self.log.warning("a decode node failed the request mid-stream; it goes on, recomputed, on another",
                         failed_node=failed.address, decode_node=address, error=str(failure),
                         tokens=len(self._generated))
        self._on_retry(DECODE)
        self._calls.open_decode(address, f"resumed on {address}")
        return True

    # --- relaying ---

    async def _relay(self) -> AsyncIterator[GenerateChunk]:
        early: list[tuple[Leg, Any]] = []  # decode events that came before the first token
        while True:
            leg, item = await self._queue.get()
            self._check_open()
            if leg is None or not self._calls.is_live(leg):
                continue  # a decode node the request moved away from, or a failed attempt's
            if isinstance(item, Exception) or (leg.role == PREFILL and item is STREAM_END and not self._first_sent):
                self._calls.end(leg, cancel=False)
                if item is not STREAM_END and not isinstance(item, grpc.aio.AioRpcError):
                    raise item
                if leg.finished:
                    continue  # the node had done its part; its stream's end does not matter
                failure = leg_failure(leg, item, self.directory) if item is not STREAM_END else UnavailableError(
                    f"prefill node {leg.address}: stream ended before the first token")
                if await self._start_over(leg, failure):
                    early.clear()  # the failed attempt's decode events
                    continue
                if await self._resume(leg, failure):
                    continue
                raise failure
            if leg.role == DECODE and not self._first_sent:
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
                    if event_leg.role == DECODE and await self._resume(event_leg, failure):
                        break
                    raise
                if chunk is not None:
                    yield chunk
                    if chunk.finish_reason:
                        self._log_finish(chunk)
                        return
                if self._first_sent and early:  # the first token just went: the decode events held back follow
                    due[:0], early = early, []

    async def _on_prefill(self, leg: Leg, item: Any) -> GenerateChunk | None:
        if item is STREAM_END:  # after the first token (before it, the relay handles it as a failure)
            self._calls.end(leg, cancel=False)
            leg.finished = True
            return None
        if isinstance(item, Refused):
            self.log.info("decode node refused", node=item.decode_address, reason=item.reason)
        elif isinstance(item, Reserved):
            self._attach(item.decode_address)
        elif isinstance(item, PrefillDone):
            leg.finished = True
        elif isinstance(item, FirstToken) and not self._first_sent:
            return await self._on_first_token(leg, item)
        return None

    async def _on_first_token(self, leg: Leg, first: FirstToken) -> GenerateChunk | None:
        self._text.cached_tokens = first.cached_tokens
        if first.finish_reason:
            # The prefill node ends the request itself, its reservation on the decode node included.
            leg.finished = True
            if (decode := self._calls.decode) is not None:
                decode.finished = True
                self._calls.end(decode, cancel=True)
        elif self._calls.decode is None:
            raise UnavailableError(f"prefill node {leg.address}: first token before a reservation")
        self._first_sent = True
        self._first_token_at = time.monotonic()
        logprobs = [first.logprob] if first.logprob is not None else []
        return await self._chunk([first.token_id], first.finish_reason, first=True, logprobs=logprobs)

    async def _on_decode(self, leg: Leg, item: Any) -> GenerateChunk | None:
        if item is STREAM_END:
            self._calls.end(leg, cancel=False)
            raise UnavailableError(f"decode node {leg.address} failed: its stream ended without a finish reason")
        if item.moved_to:
            self._move(leg, item.moved_to)
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
                     logprobs: Sequence[TokenLogprobs] = ()) -> GenerateChunk | None:
        self._generated.extend(token_ids)
        if first and self._trace is not None:
            self._detokenize = tracing.start_span("detokenize", self._trace, request_id=self.request_id)
        delta = self._text.add(token_ids, finish_reason)
        if delta.stop_matched is not None:
            await self._stop_unfinished_legs(f"stop string {delta.stop_matched!r}")
        if delta.empty:
            return None
        return GenerateChunk(
            self.request_id, delta.token_ids, delta.text, delta.finish_reason,
            self._text.usage() if delta.finish_reason else None,
            prefill_node=self._prefill_address if first else "",
            decode_node=self._decode_address if first else "",
            logprobs=tuple(logprobs[:len(delta.token_ids)]))  # none past a stop string

    async def _stop_unfinished_legs(self, reason: str) -> None:
        """The gateway ended the request (stop string): cancel the legs still running and wait for their
        nodes to confirm the abort, so the request id is free everywhere before the client hears."""
        legs = [leg for leg in self._calls.all() if not leg.finished]
        for leg in legs:
            leg.finished = True
            self._calls.end(leg, cancel=True)
        await self._calls.abort(legs, reason)

    # --- helpers ---

    def _end_detokenize(self) -> None:
        span, self._detokenize = self._detokenize, None
        if span is not None:
            span.set_attribute("pdserve.completion_tokens", self._text.completion_tokens)
            span.end()

    def _log_finish(self, chunk: GenerateChunk) -> None:
        usage = chunk.usage
        assert usage is not None, "a final chunk carries usage"
        now = time.monotonic()
        first = self._first_token_at if self._first_token_at is not None else now
        decoding_s = now - first
        self.log.info("request finished", finish_reason=chunk.finish_reason, prompt_tokens=usage.prompt_tokens,
                      completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
                      ttft_ms=round((first - self._started) * 1000, 1), duration_ms=self._elapsed_ms(),
                      decode_tokens_per_s=round((usage.completion_tokens - 1) / decoding_s, 1) if decoding_s > 0
                      else None, prefill_node=self._prefill_address, decode_node=self._decode_address)

    def _elapsed_ms(self) -> float:
        return round((time.monotonic() - self._started) * 1000, 1)

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

    def _deadline_unix_ms(self) -> int:
        remaining = self._timeout()
        return 0 if remaining is None else int((time.time() + remaining) * 1000)


async def _all(*aborts: Awaitable[None] | None) -> None:
    for result in await asyncio.gather(*(abort for abort in aborts if abort is not None), return_exceptions=True):
        if isinstance(result, Exception):
            log.error("an abort failed", error=repr(result))

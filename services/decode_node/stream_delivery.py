"""The decode node's token streams as the gateway reads them: engine outputs in, ``Attach`` calls out.

:class:`StreamDelivery` puts each engine step's outputs into the requests' token streams (the node's
``streams``: a :class:`TokenStream` from a request's reservation or adoption on), ends the stream of a
request whose reservation lease expired with an abort, and serves ``Attach``: the events after
``resume_after`` tokens, then the live ones, a newer ``Attach`` taking over. A stream that finished with
nobody attached is kept ``unread_stream_s`` (at least ``reattach_grace_s`` for one a lost call left), then
dropped; a request whose ``Attach`` call ended before its stream did runs on ``reattach_grace_s`` waiting
for a re-attach, then is aborted. A stream read to its end is kept ``reattach_grace_s`` for a re-attach
(``ended_streams.py``). A gateway attaches as soon as a request is reserved or adopted here; one nobody
attached to within ``reattach_grace_s`` of that is treated the same way (aborted, or dropped if it
finished): a prefill identity that commits and moves on, or an adoption nobody follows, cannot keep decode
slots busy with requests nobody reads (the per-caller grant bounds count a request only until its commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import structlog

from services.common import tracing
from services.common.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, UnavailableError
from services.decode_node.ended_streams import EndedStreams
from services.decode_node.token_stream import Superseded, TokenEvent, TokenStream
from services.engine.outputs import RequestOutput

if TYPE_CHECKING:
    from services.decode_node.node import DecodeNode

log = structlog.get_logger(__name__)


class StreamDelivery:
    def __init__(self, node: DecodeNode, unread_stream_s: float, reattach_grace_s: float) -> None:
        """``unread_stream_s``: how long the stream of a request that finished with nobody attached is kept;
        ``reattach_grace_s``: how long a request whose ``Attach`` call ended early waits for a re-attach,
        and how long a stream read to its end is kept for one."""
        self.node = node
        self.unread_stream_s = unread_stream_s
        self.reattach_grace_s = reattach_grace_s
        self.ended_streams = EndedStreams(reattach_grace_s)  # read to the end, kept for a re-attach
        self._grace_aborts: set[asyncio.Task[None]] = set()

    # ---- engine outputs into the streams ---------------------------------------------------------
    def deliver(self, payload: list[RequestOutput] | tuple[str, list[str]]) -> None:
        """The engine worker's output callback: a step's outputs, or ``("expired", request ids)``."""
        node = self.node
        if isinstance(payload, tuple):  # leases that expired
            for request_id in payload[1]:
                log.warning("reservation lease expired", request_id=request_id)
                node.grants.release(request_id)
                node.routes.pop(request_id, None)
                stream = node.streams.pop(request_id, None)
                if stream is not None:
                    stream.queue.put_nowait(TokenEvent([], finish_reason="abort", abort_reason=(
                        "its reservation lease expired: the prefill node sent nothing for it for the lease's length")))
            return
        for out in payload:
            stream = node.streams.get(out.request_id)
            if stream is None:
                continue
            event = TokenEvent(list(out.new_token_ids), logprobs=list(out.new_logprobs))
            if out.finished:
                node.routes.pop(out.request_id, None)
                if not stream.attached:  # one a lost call left waits for its re-attach at least the grace
                    keep_s = max(self.unread_stream_s, self.reattach_grace_s) if stream.was_attached \
                        else self.unread_stream_s
                    asyncio.get_running_loop().call_later(keep_s, self._drop_unread, out.request_id, stream)
                event.finish_reason = out.finish_reason
                event.abort_reason = out.abort_reason
                event.prompt_tokens, event.completion_tokens = out.prompt_tokens, out.completion_tokens
                event.cached_tokens = out.cached_tokens
            stream.queue.put_nowait(event)

    # ---- Attach ----------------------------------------------------------------------------------
    async def attach(self, request_id: str, resume_after: int = 0) -> AsyncIterator[TokenEvent]:
        """``DecodeNode.attach``: the request's events after the first ``resume_after`` tokens, then the
        live ones; a newer ``attach`` takes over (this one ends ``FAILED_PRECONDITION``)."""
        node = self.node
        stream = node.streams.get(request_id) or self.ended_streams.get(request_id)
        if stream is None and node.failure:
            raise UnavailableError(node.failure)
        if stream is None:
            raise NotFoundError(f"decode node holds no request {request_id!r} to attach to")
        if resume_after > len(stream.queue.tokens):
            raise InvalidArgumentError("resume_after", f"{resume_after} tokens, but this node has decoded only "
                                                       f"{len(stream.queue.tokens)} of request {request_id!r}")
        if stream.was_attached:
            log.info("re-attached", request_id=request_id, resume_after=resume_after,
                     took_over=stream.attached, tokens_here=len(stream.queue.tokens))
        reader = stream.take_over()
        stream.trace = tracing.current_context()
        ended = False
        try:
            async for event in stream.queue.read(resume_after, lambda: stream.reader is reader):
                if event.error:
                    raise UnavailableError(event.error)
                ended = event.ends
                if ended:
                    log.debug("decode finished", finish_reason=event.finish_reason, moved_to=event.moved_to,
                              completion_tokens=event.completion_tokens)
                yield event
                if event.moved_to:  # delivered: the gateway follows the request there
                    node.moved.pop(request_id, None)
        except Superseded:
            raise FailedPreconditionError(f"a newer Attach of request {request_id!r} took over its stream") from None
        finally:
            stream.let_go(reader)
            self._after_read(request_id, stream, ended)

    def _after_read(self, request_id: str, stream: TokenStream, ended: bool) -> None:
        """An Attach of ``stream`` stopped reading it: keep an ended stream for a re-attach, or wait the
        grace for one (``ended``: its last event was taken; then it is no longer a running request)."""
        if stream.attached:
            return  # a newer Attach reads it now
        streams = self.node.streams
        failed = stream.queue.end is not None and bool(stream.queue.end.error)  # this node failed: no retry
        if ended or failed:
            if streams.get(request_id) is stream:
                del streams[request_id]
            if ended:
                self.ended_streams.keep(request_id, stream)
            return
        if streams.get(request_id) is not stream or self.node.worker.stopped:
            return  # aborted meanwhile (its stream is gone), or the node stops
        log.info("the Attach call ended before the request did: waiting for a re-attach", request_id=request_id,
                 grace_s=self.reattach_grace_s, tokens_here=len(stream.queue.tokens))
        asyncio.get_running_loop().call_later(self.reattach_grace_s, self._grace_over, request_id, stream)

    # ---- nobody reading --------------------------------------------------------------------------
    def expect_attach(self, request_id: str, stream: TokenStream) -> None:
        """``stream`` was just made (a reservation or an adoption): unless some ``Attach`` reads it within
        ``reattach_grace_s``, its request is aborted (its stream dropped if it finished)."""
        asyncio.get_running_loop().call_later(self.reattach_grace_s, self._attach_overdue, request_id, stream)

    def _attach_overdue(self, request_id: str, stream: TokenStream) -> None:
        if not stream.was_attached:
            self._grace_over(request_id, stream)

    def _grace_over(self, request_id: str, stream: TokenStream) -> None:
        """Nobody re-attached within the grace: a finished stream is dropped, a running request aborted."""
        if self.node.streams.get(request_id) is not stream or stream.attached:
            return
        if stream.finished:
            self._drop_unread(request_id, stream)
            return
        log.warning("nobody attached within the grace: aborting the request", request_id=request_id,
                    grace_s=self.reattach_grace_s, attached_before=stream.was_attached)
        task = asyncio.ensure_future(self._abort_unattached(request_id, stream.was_attached))
        self._grace_aborts.add(task)
        task.add_done_callback(self._grace_aborts.discard)

    async def _abort_unattached(self, request_id: str, attached_before: bool) -> None:
        after = "its Attach call ended" if attached_before else "it was reserved or adopted here"
        try:
            await self.node.abort(request_id, f"nobody attached to it for {self.reattach_grace_s:g} s after {after}")
        except Exception as error:  # the node stops meanwhile: nothing is left to free
            log.warning("could not abort a request nobody re-attached to", request_id=request_id, error=repr(error))

    def _drop_unread(self, request_id: str, stream: TokenStream) -> None:
        streams = self.node.streams
        if streams.get(request_id) is stream and not stream.attached:
            log.warning("dropped the tokens of a request that finished with nobody attached", request_id=request_id,
                        attached_before=stream.was_attached)
            del streams[request_id]

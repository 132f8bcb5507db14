"""A request's token stream on the decode node: what its steps decoded, kept for the gateway's ``Attach``.

The stream is a log, not a queue: reading it does not consume it. Its tokens are kept flat (one
``array('I')``, their logprobs beside them when the request asks for them), so a stream holds at most the
request's ``max_tokens`` token ids, however its steps were batched; the first event that ends it (a finish,
``moved_to``, an abort, the node's failure) is kept apart and read last. A reader starts after the first
``after`` tokens (``AttachRequest.resume_after``: the tokens the caller already has from this node's
streams of the request; never the first output token, which the prefill node reports) and gets the tokens
it has not seen as one event, then waits for more. So a gateway whose call broke (a stall, a lost
connection) attaches again and resumes exactly where it stopped: no gap, no duplicate.

One reader at a time: a newer one takes over (:meth:`TokenStream.take_over`), and the older one's read
ends with :class:`Superseded` at its next wake-up.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from services.engine.logprobs import TokenLogprobs


@dataclass
class TokenEvent:
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    moved_to: str = ""  # the request went on to this decode node: the stream's last event
    abort_reason: str = ""  # with finish_reason "abort": why this node gave up on the request
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked for
    error: str = ""  # this node failed (its engine): the stream ends UNAVAILABLE with this

    @property
    def ends(self) -> bool:
        """This event is the stream's last: nothing after it is read."""
        return self.finish_reason is not None or bool(self.moved_to) or bool(self.error)


class Superseded(Exception):
    """A newer ``Attach`` of the request took its stream over: this read ends."""


class EventLog:
    """The events put on a stream, kept for every reader. ``put_nowait`` as on a queue (the engine's
    deliveries, aborts, handovers and failures put events on the event loop)."""

    def __init__(self) -> None:
        self.tokens = array("I")
        self.logprobs: list[TokenLogprobs] = []  # beside tokens when the request asks for logprobs
        self.end: TokenEvent | None = None  # the first event that ended the stream, its tokens in ``tokens``
        self._changed = asyncio.Event()

    def put_nowait(self, event: TokenEvent) -> None:
        if self.end is not None:
            return  # the stream has ended: nothing after its last event is read
        self.tokens.extend(event.token_ids)
        self.logprobs.extend(event.logprobs)
        if event.ends:
            self.end = TokenEvent([], event.finish_reason, event.prompt_tokens, event.completion_tokens,
                                  event.cached_tokens, event.moved_to, event.abort_reason, error=event.error)
        self.wake()

    def wake(self) -> None:
        """Wake every reader (new events, or a reader taken over)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def read(self, after: int, still_reading: Callable[[], bool]) -> AsyncIterator[TokenEvent]:
        """The events past the first ``after`` tokens, as they come; the last one is the end event (with
        the tokens not yet read). Raises :class:`Superseded` once ``still_reading()`` is false."""
        position = after
        while True:
            if not still_reading():
                raise Superseded
            changed = self._changed
            end = self.end
            if position < len(self.tokens) or end is not None:
                tokens = self.tokens[position:].tolist()
                logprobs = self.logprobs[position:position + len(tokens)]
                position += len(tokens)
                if end is None:
                    yield TokenEvent(tokens, logprobs=logprobs)
                    continue
                yield TokenEvent(tokens, end.finish_reason, end.prompt_tokens, end.completion_tokens,
                                 end.cached_tokens, end.moved_to, end.abort_reason, logprobs, end.error)
                return
            await changed.wait()


@dataclass
class TokenStream:
    """A request's stream on the decode node (see the module's docstring). ``queue``: its events (the
    name of the queue it once was; producers call ``queue.put_nowait``)."""

    queue: EventLog = field(default_factory=EventLog)
    reader: object | None = None  # the Attach reading it now; None: nobody attached
    was_attached: bool = False  # some Attach read it once (a detached stream waits for a re-attach)
    trace: Any = None  # the Attach span's trace context (tracing on): parent of the ``decode`` span

    @property
    def attached(self) -> bool:
        return self.reader is not None

    @property
    def finished(self) -> bool:
        return self.queue.end is not None

    def take_over(self) -> object:
        """A new reader: the one reading now (if any) ends at its next wake-up. Its token."""
        self.reader = token = object()
        self.was_attached = True
        self.queue.wake()
        return token

    def let_go(self, token: object) -> None:
        """The reader ``token`` stopped reading (if it still was the reader, nobody is attached now)."""
        if self.reader is token:
            self.reader = None

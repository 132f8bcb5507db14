"""One request's output as Responses' output items, as the stream's typed events and as the whole response.

One state machine (:class:`ResponseEvents`) reads the request's chunks in order, streamed or not, so a
response is the same either way. The output splits as a chat choice's does (``OutputSplit``): reasoning → a
``reasoning`` item (its text as ``reasoning_text`` content), text → a ``message`` item with one ``output_text``
part, each call → a ``function_call`` item, in the order they come (text after a call is a second message).
Blank text is held back until text that is not blank follows: it is no message of its own (blank text between
the reasoning and a call is not an answer), except in an output with no item at all, whose message it is.
The status is ``completed`` for a ``stop``, else ``incomplete`` (a ``length``: ``incomplete_details.reason =
max_output_tokens``), and so is the item the output was cut in.

Streamed events (each ``event: <type>`` with its JSON, numbered by ``sequence_number``): ``response.created``,
``response.in_progress``; per item ``response.output_item.added``, its part's ``response.content_part.added``,
``response.reasoning_text.delta`` / ``response.output_text.delta`` / ``response.function_call_arguments.delta``
(a call's whole arguments, once it is parsed), the matching ``.done`` events, ``response.output_item.done``;
last ``response.completed`` or ``response.incomplete`` (the whole response), or ``response.failed`` on an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.engine.logprobs import TokenLogprobs
from services.gateway.generation import GenerateChunk, Usage
from services.gateway.openai.event_stream import sse
from services.gateway.openai.logprobs_render import LogprobsRender
from services.gateway.openai.output_split import Delta, OutputSplit
from services.gateway.openai.responses import ChatTokenLogprob
from services.gateway.openai.responses_api.objects import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponsesUsage,
)
from services.gateway.openai.tools.types import ParsedToolCall


@dataclass(frozen=True)
class ResponseRender:
    """How one request's output becomes its response: ``shell`` (the response in progress, settings echoed),
    ``split``, ``logprobs`` (None: not asked for), ``reasoning_end_ids`` (the reasoning end marker's tokens,
    to count the reasoning tokens)."""

    shell: ResponseObject
    split: OutputSplit
    logprobs: LogprobsRender | None = None
    reasoning_end_ids: tuple[int, ...] = ()

    def call_item(self, call: ParsedToolCall, status: str) -> FunctionCallItem:
        tools = self.split.tools
        assert tools is not None, "calls come only from a tool-call parser"
        return FunctionCallItem(call_id=call.call_id or tools.new_call_id(), name=call.name,
                                arguments=call.arguments, status=status)

    def logprobs_of(self, logprobs: Sequence[TokenLogprobs]) -> list[ChatTokenLogprob]:
        """The output text's entries of ``logprobs`` (none when the request did not ask for them)."""
        return self.logprobs.chat(logprobs).content if self.logprobs is not None else []

    def finished(self, items: list[OutputItem], finish_reason: str, usage: Usage, token_ids: Sequence[int],
                 reasoned: bool) -> ResponseObject:
        """The finished response with its ``items``."""
        complete = finish_reason == "stop"
        details = None if complete else IncompleteDetails(
            reason="max_output_tokens" if finish_reason == "length" else None)
        reasoning = _reasoning_tokens(token_ids, self.reasoning_end_ids) if reasoned else 0
        return self.shell.model_copy(update={
            "status": "completed" if complete else "incomplete", "output": items, "incomplete_details": details,
            "usage": ResponsesUsage(
                input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                total_tokens=usage.prompt_tokens + usage.completion_tokens,
                input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
                output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning))})


def _reasoning_tokens(token_ids: Sequence[int], end_ids: tuple[int, ...]) -> int:
    """The output's tokens up to its reasoning end marker, the marker's included; all of them when the output
    has reasoning and no end marker (it was cut while thinking)."""
    n = len(end_ids)
    for start in range(len(token_ids) - n + 1) if n else ():
        if tuple(token_ids[start:start + n]) == end_ids:
            return start + n
    return len(token_ids)


class ResponseEvents:
    """One request's stream of events: :meth:`opening`, then :meth:`chunk` for each of its chunks (the last
    one, which has the finish reason, ends the response: then :attr:`response` is the whole response), or
    :meth:`failed`."""

    def __init__(self, render: ResponseRender) -> None:
        self.render = render
        self._stream = render.split.stream()
        self._sequence = 0
        self._items: list[OutputItem] = []
        self._open: ReasoningItem | MessageItem | None = None  # the item text is streaming into
        self._text: list[str] = []  # the open item's text so far
        self._logprobs: list[ChatTokenLogprob] = []  # the open message's
        self._held = ""  # blank text, until text that is not blank follows
        self._held_logprobs: list[ChatTokenLogprob] = []
        self._token_ids: list[int] = []
        self._reasoned = False
        self.response: ResponseObject | None = None  # once finished

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(body)

    def opening(self) -> list[bytes]:
        shell = _json(self.render.shell)
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def chunk(self, chunk: GenerateChunk) -> list[bytes]:
        self._token_ids += chunk.token_ids
        delta = self._stream.read(chunk.text, last=bool(chunk.finish_reason))
        logprobs = self.render.logprobs_of(chunk.logprobs) if chunk.logprobs else []
        events = self._delta(delta, logprobs)
        if chunk.finish_reason:
            assert chunk.usage is not None, "the last chunk carries the usage"
            events += self._end(chunk.finish_reason)
            response = self.render.finished(self._items, chunk.finish_reason, chunk.usage, self._token_ids,
                                            self._reasoned)
            self.response = response
            kind = "response.completed" if response.status == "completed" else "response.incomplete"
            events.append(self._event(kind, response=_json(response)))
        return events

    def whole(self) -> bytes | None:
        return self.response.model_dump_json().encode() if self.response is not None else None

    def failed(self, status: int, message: str) -> list[bytes]:
        """``response.failed``, its error coded by the HTTP status the failure would have had."""
        code = {400: "invalid_prompt", 429: "rate_limit_exceeded"}.get(status, "server_error")
        events = self._close("abort")
        response = self.render.shell.model_copy(update={"status": "failed", "output": self._items,
                                                        "error": ResponseError(code=code, message=message)})
        return [*events, self._event("response.failed", response=_json(response))]

    def _delta(self, delta: Delta, logprobs: list[ChatTokenLogprob]) -> list[bytes]:
        events: list[bytes] = []
        if delta.reasoning:
            self._reasoned = True
            if not isinstance(self._open, ReasoningItem):
                events += self._close("stop")
                events += self._start(ReasoningItem(status="in_progress"), ReasoningText(text=""))
            events += self._text_delta("response.reasoning_text.delta", delta.reasoning)
        for piece in delta.pieces:
            if piece.call is not None:
                events += self._close("stop")
                events += self._call(self.render.call_item(piece.call, status="in_progress"))
            elif piece.content:
                events += self._content(piece.content, logprobs)
                logprobs = []
        if logprobs:  # a chunk whose tokens add no text yet (a split character, text a parser holds back)
            events += self._content("", logprobs)
        return events

    def _content(self, text: str, logprobs: list[ChatTokenLogprob]) -> list[bytes]:
        if not isinstance(self._open, MessageItem):
            self._held, self._held_logprobs = self._held + text, self._held_logprobs + logprobs
            if not self._held.strip():
                return []
            text, logprobs, self._held, self._held_logprobs = self._held, self._held_logprobs, "", []
            events = self._close("stop")
            events += self._start(MessageItem(status="in_progress"), OutputText(text=""))
        else:
            events = []
        self._logprobs += logprobs
        return events + self._text_delta("response.output_text.delta", text, logprobs=[
            lp.model_dump() for lp in logprobs])

    def _start(self, item: ReasoningItem | MessageItem, part: ReasoningText | OutputText) -> list[bytes]:
        self._open, self._text, self._logprobs = item, [], []
        index = len(self._items)
        return [self._event("response.output_item.added", output_index=index, item=item.model_dump(mode="json")),
                self._event("response.content_part.added", item_id=item.id, output_index=index, content_index=0,
                            part=part.model_dump(mode="json"))]

    def _text_delta(self, kind: str, text: str, **fields: Any) -> list[bytes]:
        assert self._open is not None
        self._text.append(text)
        return [self._event(kind, item_id=self._open.id, output_index=len(self._items), content_index=0,
                            delta=text, **fields)]

    def _end(self, finish_reason: str) -> list[bytes]:
        """Close the open item; an output with no item at all gets its (blank or empty) text as its message.
        Reasoning followed by blank text ended before the cut."""
        if isinstance(self._open, ReasoningItem) and self._held:
            return self._close("stop")
        if self._open is not None or self._items:
            return self._close(finish_reason)
        held, logprobs, self._held, self._held_logprobs = self._held, self._held_logprobs, "", []
        events = self._start(MessageItem(status="in_progress"), OutputText(text=""))
        if held or logprobs:
            self._logprobs += logprobs
            events += self._text_delta("response.output_text.delta", held,
                                       logprobs=[lp.model_dump() for lp in logprobs])
        return events + self._close(finish_reason)

    def _close(self, finish_reason: str) -> list[bytes]:
        """Close the open item (``finish_reason``: ``stop`` unless the output was cut in it)."""
        if self._open is None:
            return []
        item, text, index = self._open, "".join(self._text), len(self._items)
        status = "completed" if finish_reason == "stop" else "incomplete"
        if isinstance(item, ReasoningItem):
            part: ReasoningText | OutputText = ReasoningText(text=text)
            done = [self._event("response.reasoning_text.done", item_id=item.id, output_index=index,
                                content_index=0, text=text)]
        else:
            part = OutputText(text=text, logprobs=self._logprobs)
            done = [self._event("response.output_text.done", item_id=item.id, output_index=index, content_index=0,
                                text=text, logprobs=[lp.model_dump() for lp in self._logprobs])]
        item = item.model_copy(update={"content": [part], "status": status})
        done += [self._event("response.content_part.done", item_id=item.id, output_index=index, content_index=0,
                             part=part.model_dump(mode="json")),
                 self._event("response.output_item.done", output_index=index, item=item.model_dump(mode="json"))]
        self._items.append(item)
        self._open = None
        return done

    def _call(self, item: FunctionCallItem) -> list[bytes]:
        index = len(self._items)
        done = item.model_copy(update={"status": "completed"})
        self._items.append(done)
        return [self._event("response.output_item.added", output_index=index,
                            item=item.model_copy(update={"arguments": ""}).model_dump(mode="json")),
                self._event("response.function_call_arguments.delta", item_id=item.id, output_index=index,
                            delta=item.arguments),
                self._event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                            name=item.name, arguments=item.arguments),
                self._event("response.output_item.done", output_index=index, item=done.model_dump(mode="json"))]


def _json(response: ResponseObject) -> dict[str, Any]:
    return response.model_dump(mode="json")

"""One request's output as Anthropic's content blocks: the stream's events and the whole message, from one
reading of the request's chunks (streamed or not, the message is the same).

The output splits as a chat choice's does: reasoning → a ``thinking`` block (its ``signature`` empty: nothing
is signed here), text → a ``text`` block, each call → a ``tool_use`` block (``input``: the call's arguments), in
the order they come. Blank text is held back until text that is not blank follows (blank text between the
thinking and a call is no block). ``stop_reason``: ``tool_use`` when the output made calls and stopped,
``stop_sequence`` (naming it in ``stop_sequence``) when one of ``stop_sequences`` ended it, ``max_tokens`` at
the limit, else ``end_turn``. ``usage``: ``input_tokens`` (the prompt's tokens not read from the prefix cache),
``cache_read_input_tokens`` (those that were), ``output_tokens``.

Events (``event: <type>`` and its JSON): ``message_start`` (the message with no content), per block
``content_block_start``, ``content_block_delta`` (``text_delta``, ``thinking_delta``, or a call's whole
arguments as one ``input_json_delta`` once it is parsed), ``content_block_stop``; then ``message_delta``
(``stop_reason``, ``stop_sequence``, ``usage``) and ``message_stop``; an error after the first token is an
``error`` event.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from services.gateway.generation import GenerateChunk, Usage
from services.gateway.openai.errors import ANTHROPIC_TYPES
from services.gateway.openai.event_stream import sse
from services.gateway.openai.output_split import OutputSplit


@dataclass(frozen=True)
class MessageRender:
    """``message_id``, ``model``, ``split`` (how the output splits), ``prompt_tokens`` (for ``message_start``)."""

    message_id: str
    model: str
    split: OutputSplit
    prompt_tokens: int


def usage_of(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0}


class MessageEvents:
    """:meth:`opening`, then :meth:`chunk` for each chunk (the last ends the message: :attr:`message` is then
    the whole message), or :meth:`failed`."""

    def __init__(self, render: MessageRender) -> None:
        self.render = render
        self._stream = render.split.stream()
        self._blocks: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the text or thinking block text is streaming into
        self._held = ""  # blank text, until text that is not blank follows
        self.message: dict[str, Any] | None = None  # once finished

    def _shell(self) -> dict[str, Any]:
        return {"id": self.render.message_id, "type": "message", "role": "assistant", "model": self.render.model,
                "content": [], "stop_reason": None, "stop_sequence": None}

    def opening(self) -> list[bytes]:
        usage = {"input_tokens": self.render.prompt_tokens, "output_tokens": 0}
        return [sse({"type": "message_start", "message": {**self._shell(), "usage": usage}})]

    def chunk(self, chunk: GenerateChunk) -> list[bytes]:
        delta = self._stream.read(chunk.text, last=bool(chunk.finish_reason))
        events: list[bytes] = []
        if delta.reasoning:
            events += self._text("thinking", delta.reasoning)
        for piece in delta.pieces:
            if piece.call is not None:
                events += self._close()
                events += self._tool_use(piece.call.name, piece.call.arguments, piece.call.call_id)
            elif piece.content:
                events += self._content(piece.content)
        if chunk.finish_reason:
            assert chunk.usage is not None, "the last chunk carries the usage"
            events += self._close()
            reason, sequence = self._stop_reason(chunk)
            usage = usage_of(chunk.usage)
            self.message = {**self._shell(), "content": self._blocks, "stop_reason": reason,
                            "stop_sequence": sequence, "usage": usage}
            events += [sse({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                            "usage": usage}),
                       sse({"type": "message_stop"})]
        return events

    def whole(self) -> bytes | None:
        return json.dumps(self.message, ensure_ascii=False).encode() if self.message is not None else None

    def failed(self, status: int, message: str) -> list[bytes]:
        """An ``error`` event, its type by the HTTP status the failure would have had."""
        error = {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}
        return [*self._close(), sse({"type": "error", "error": error})]

    def _stop_reason(self, chunk: GenerateChunk) -> tuple[str, str | None]:
        if chunk.finish_reason == "length":
            return "max_tokens", None
        if chunk.finish_reason == "stop" and any(block["type"] == "tool_use" for block in self._blocks):
            return "tool_use", None
        if chunk.stop_string is not None:
            return "stop_sequence", chunk.stop_string
        return "end_turn", None

    def _content(self, text: str) -> list[bytes]:
        if self._open is None or self._open["type"] != "text":
            self._held += text
            if not self._held.strip():
                return []
            text, self._held = self._held, ""
        return self._text("text", text)

    def _text(self, kind: str, text: str) -> list[bytes]:
        """``text`` into the open block of ``kind`` (``text`` or ``thinking``), opening one where needed."""
        events: list[bytes] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            self._open = {"type": "text", "text": ""} if kind == "text" else {
                "type": "thinking", "thinking": "", "signature": ""}
            events.append(sse({"type": "content_block_start", "index": len(self._blocks),
                               "content_block": dict(self._open)}))
        self._open[kind] += text
        delta = {"type": "text_delta", "text": text} if kind == "text" else {"type": "thinking_delta",
                                                                             "thinking": text}
        return [*events, sse({"type": "content_block_delta", "index": len(self._blocks), "delta": delta})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        block, self._open = self._open, None
        self._blocks.append(block)
        return [sse({"type": "content_block_stop", "index": len(self._blocks) - 1})]

    def _tool_use(self, name: str, arguments: str, call_id: str | None) -> list[bytes]:
        index = len(self._blocks)
        block = {"type": "tool_use", "id": call_id or f"toolu_{uuid.uuid4().hex[:24]}", "name": name,
                 "input": json.loads(arguments)}
        self._blocks.append(block)
        return [sse({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}),
                sse({"type": "content_block_delta", "index": index,
                     "delta": {"type": "input_json_delta", "partial_json": arguments}}),
                sse({"type": "content_block_stop", "index": index})]

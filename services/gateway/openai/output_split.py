"""One choice's output split into reasoning, content and tool calls, whole or as it streams.

The reasoning comes first (when the front has a reasoning parser): what follows the end of the thinking is
the answer, read for tool calls (when the request offers tools and its ``tool_choice`` is not ``none``).
Each choice streams through its own :class:`StreamSplit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.gateway.openai.reasoning.types import ReasoningParser, ReasoningStream
from services.gateway.openai.tools.types import ParsedToolCall, StreamPiece, ToolCallParser, ToolSpec, ToolStream


@dataclass(frozen=True)
class SplitOutput:
    """``reasoning``: None when the front has no reasoning parser."""

    content: str
    reasoning: str | None = None
    calls: tuple[ParsedToolCall, ...] = ()


@dataclass
class Delta:
    """What a streamed piece of output adds: reasoning, content, and the calls that closed in it; ``pieces``:
    the answer's content and calls in the order they came (the Responses API makes items of them)."""

    reasoning: str = ""
    content: str = ""
    calls: list[ParsedToolCall] = field(default_factory=list)
    pieces: list[StreamPiece] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)

    def then(self, later: Delta) -> Delta:
        """This delta followed by ``later`` (reasoning always precedes the answer)."""
        return Delta(self.reasoning + later.reasoning, self.content + later.content, self.calls + later.calls,
                     self.pieces + later.pieces)


@dataclass(frozen=True)
class OutputSplit:
    """How a request's output is split: ``tools`` None when it is not read for calls."""

    reasoning: ReasoningParser | None = None
    tools: ToolCallParser | None = None
    tool_specs: tuple[ToolSpec, ...] = ()  # the request's tools (GLM's parser types argument values by them)

    def whole(self, text: str) -> SplitOutput:
        reasoning = None
        if self.reasoning is not None:
            split = self.reasoning.split(text)
            reasoning, text = split.reasoning, split.content
        if self.tools is None:
            return SplitOutput(text, reasoning)
        parsed = self.tools.parse(text, self.tool_specs)
        return SplitOutput(parsed.content, reasoning, parsed.calls)

    def stream(self) -> StreamSplit:
        return StreamSplit(self.reasoning.stream() if self.reasoning is not None else None,
                           self.tools.stream(self.tool_specs) if self.tools is not None else None)


class StreamSplit:
    def __init__(self, reasoning: ReasoningStream | None, tools: ToolStream | None) -> None:
        self.reasoning, self.tools = reasoning, tools

    def feed(self, text: str) -> Delta:
        delta = Delta()
        if not text:
            return delta
        if self.reasoning is not None:
            split = self.reasoning.feed(text)
            delta.reasoning, text = split.reasoning, split.content
        self._answer(text, delta)
        return delta

    def finish(self) -> Delta:
        """The output ended: everything held back."""
        delta = Delta()
        if self.reasoning is not None:
            split = self.reasoning.finish()
            delta.reasoning = split.reasoning
            self._answer(split.content, delta)
        if self.tools is not None:
            _add(self.tools.finish(), delta)
        return delta

    def _answer(self, text: str, delta: Delta) -> None:
        if self.tools is None:
            delta.content += text
            if text:
                delta.pieces.append(StreamPiece(content=text))
        elif text:
            _add(self.tools.feed(text), delta)


def _add(pieces: list[StreamPiece], delta: Delta) -> None:
    delta.pieces += pieces
    for piece in pieces:
        delta.content += piece.content
        if piece.call is not None:
            delta.calls.append(piece.call)

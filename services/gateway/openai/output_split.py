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
    """What a streamed piece of output adds: reasoning, and the answer's ``pieces`` (content text and the calls
    that closed in it) in the order they came; ``content`` and ``calls`` are the pieces' (the Responses and
    Messages APIs make items of the pieces themselves)."""

    reasoning: str = ""
    pieces: list[StreamPiece] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "".join(piece.content for piece in self.pieces)

    @property
    def calls(self) -> list[ParsedToolCall]:
        return [piece.call for piece in self.pieces if piece.call is not None]

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)

    def then(self, later: Delta) -> Delta:
        """This delta followed by ``later`` (reasoning always precedes the answer)."""
        return Delta(self.reasoning + later.reasoning, self.pieces + later.pieces)


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

    def read(self, text: str, last: bool) -> Delta:
        """What a chunk's ``text`` adds; the ``last`` chunk's includes everything held back."""
        delta = self.feed(text)
        return delta.then(self.finish()) if last else delta

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
            delta.pieces += self.tools.finish()
        return delta

    def _answer(self, text: str, delta: Delta) -> None:
        if self.tools is None:
            if text:
                delta.pieces.append(StreamPiece(content=text))
        elif text:
            delta.pieces += self.tools.feed(text)

"""A chat prompt that closed the reasoning itself (Qwen3's template with ``enable_thinking: false`` writes
``<think>\\n\\n</think>\\n\\n`` into the assistant's turn; ``PreparedRequest.reasoning_closed``): the whole
output is the answer. Stands in for the front's reasoning parser on such a request, so the response still
has its ``reasoning_content`` field (``null``) and a parser that reads text before any ``</think>`` as
reasoning (DeepSeek-R1's) does not take the answer."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.openai.reasoning.types import ReasoningParser, ReasoningSplit, ReasoningStream


class _AllContent:
    def feed(self, text: str) -> ReasoningSplit:
        return ReasoningSplit(content=text)

    def finish(self) -> ReasoningSplit:
        return ReasoningSplit()


@dataclass(frozen=True)
class ClosedReasoning:
    name: str
    start_marker: str
    end_marker: str
    markers: tuple[str, ...]

    @classmethod
    def of(cls, parser: ReasoningParser) -> ClosedReasoning:
        """Standing in for ``parser`` (the front's, whose markers these are)."""
        return cls(parser.name, parser.start_marker, parser.end_marker, parser.markers)

    def split(self, text: str) -> ReasoningSplit:
        return ReasoningSplit(content=text)

    def stream(self) -> ReasoningStream:
        return _AllContent()

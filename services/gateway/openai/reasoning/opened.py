"""A chat prompt that opened the reasoning itself (DeepSeek-R1's template and Qwen3's thinking ones end the prompt
with ``<think>\\n``; newer Gemma 4 templates open the thought channel after a tool's result when thinking is on;
``PreparedRequest.reasoning_opened``): the output begins inside the reasoning. Stands in for the front's reasoning
parser on such a request, reading the output as the parser would read it after its start marker, so a parser whose
output must open the reasoning itself (Qwen3's, Gemma 4's) does not stream the thinking as content."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.openai.reasoning.types import ReasoningParser, ReasoningSplit, ReasoningStream


class _AfterStart:
    """``stream`` fed the start marker before the output."""

    def __init__(self, stream: ReasoningStream, start_marker: str) -> None:
        self._stream = stream
        self._opened = stream.feed(start_marker)  # nothing comes out of the marker alone: held for the first feed

    def feed(self, text: str) -> ReasoningSplit:
        split, opened = self._stream.feed(text), self._opened
        self._opened = ReasoningSplit()
        return ReasoningSplit(opened.reasoning + split.reasoning, opened.content + split.content)

    def finish(self) -> ReasoningSplit:
        return self._stream.finish()


@dataclass(frozen=True)
class OpenedReasoning:
    parser: ReasoningParser

    @classmethod
    def of(cls, parser: ReasoningParser) -> OpenedReasoning:
        """Standing in for ``parser`` (the front's)."""
        return cls(parser)

    @property
    def name(self) -> str:
        return self.parser.name

    @property
    def start_marker(self) -> str:
        return self.parser.start_marker

    @property
    def end_marker(self) -> str:
        return self.parser.end_marker

    @property
    def markers(self) -> tuple[str, ...]:
        return self.parser.markers

    def split(self, text: str) -> ReasoningSplit:
        """As the stream reads it: after the start marker, an output cut before the end marker is all reasoning
        (a parser's ``split`` of a start marker never closed may read it otherwise), and a harmony output's
        calls, which come without that end marker, stay its content."""
        stream = self.stream()
        head, tail = stream.feed(text), stream.finish()
        return ReasoningSplit(head.reasoning + tail.reasoning, head.content + tail.content)

    def stream(self) -> ReasoningStream:
        return _AfterStart(self.parser.stream(), self.parser.start_marker)

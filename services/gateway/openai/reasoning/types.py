"""The contract of reasoning parsers (``--reasoning-parser``): a reasoning model writes its thinking between
markers (``<think>…</think>`` for Qwen3 and DeepSeek-R1) before the answer; the HTTP front moves the
thinking into ``reasoning_content`` and keeps the answer as ``content``. A response_format or a forced tool
call then applies after ``end_marker`` (``StructuredSpec.starts_after_token_ids``: the marker's tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str = ""
    content: str = ""


class ReasoningStream(Protocol):
    """One streamed output: text in, the part of it that is reasoning and the part that is content out
    (text that may be the start of a marker is held back until it is known)."""

    def feed(self, text: str) -> ReasoningSplit:
        ...

    def finish(self) -> ReasoningSplit:
        """The output ended: what is held back."""
        ...


class ReasoningParser(Protocol):
    name: str  # as --reasoning-parser names it
    start_marker: str  # the text that opens the reasoning
    end_marker: str  # the text that ends the reasoning; one token of the vocabulary (checked at startup)
    markers: tuple[str, ...]  # its marker texts: kept in the decoded output where they are special tokens

    def split(self, text: str) -> ReasoningSplit:
        ...

    def stream(self) -> ReasoningStream:
        ...

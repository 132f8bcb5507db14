"""The streamed split of ``<think>…</think>`` output, shared by the Qwen3 and DeepSeek-R1 parsers.

A stream first decides whether the output opens with ``<think>`` (held back while the text so far may be its
start). Inside an opened ``<think>``, text is reasoning until ``</think>``. Without one, text before
``</think>`` goes to ``unopened`` ("reasoning" for DeepSeek-R1, whose template opens the ``<think>`` in the
prompt; "content" for Qwen3, as vLLM streams a Qwen3 output that did not start thinking). After ``</think>``
everything is content, its leading line breaks dropped. Text that may start ``</think>`` is held back.
"""

from __future__ import annotations

from typing import Literal

from services.gateway.openai.reasoning.markers import THINK_END, THINK_START, MarkerScanner, strip_leading_newlines
from services.gateway.openai.reasoning.types import ReasoningSplit

Channel = Literal["reasoning", "content"]


def _to(channel: Channel, text: str) -> ReasoningSplit:
    return ReasoningSplit(reasoning=text) if channel == "reasoning" else ReasoningSplit(content=text)


def _join(first: ReasoningSplit, second: ReasoningSplit) -> ReasoningSplit:
    return ReasoningSplit(first.reasoning + second.reasoning, first.content + second.content)


class ThinkStream:
    """One streamed output (a :class:`~services.gateway.openai.reasoning.types.ReasoningStream`)."""

    def __init__(self, unopened: Channel, start: str = THINK_START, end: str = THINK_END):
        """``start``/``end``: the markers (Seed-OSS's are ``<seed:think>``/``</seed:think>``)."""
        self._unopened: Channel = unopened
        self._start_marker = start
        self._start = ""  # the text so far while it may still be the start of "<think>"
        self._channel: Channel | None = None  # where text before "</think>" goes, once decided
        self._ended = False
        self._answer_started = False
        self._end = MarkerScanner(end)

    def feed(self, text: str) -> ReasoningSplit:
        if self._ended:
            return self._answer(text)
        if self._channel is None:
            text = self._decide_opening(text)
            if self._channel is None:
                return ReasoningSplit()
        scan = self._end.feed(text)
        released = _to(self._channel, scan.released)
        if not scan.found:
            return released
        self._ended = True
        return _join(released, self._answer(scan.after))

    def finish(self) -> ReasoningSplit:
        if self._ended:
            return ReasoningSplit()
        if self._channel is None:  # the whole output is a piece of "<think>"
            held, self._start = self._start, ""
            return _to(self._unopened, held)
        return _to(self._channel, self._end.finish())

    def _decide_opening(self, text: str) -> str:
        """Text past the opening (if any) once it is decided; "" while undecided."""
        text = self._start + text
        if text.startswith(self._start_marker):
            self._channel, self._start = "reasoning", ""
            return text[len(self._start_marker):]
        if self._start_marker.startswith(text):
            self._start = text
            return ""
        self._channel, self._start = self._unopened, ""
        return text

    def _answer(self, text: str) -> ReasoningSplit:
        if not self._answer_started:
            text = strip_leading_newlines(text)
            self._answer_started = bool(text)
        return ReasoningSplit(content=text)

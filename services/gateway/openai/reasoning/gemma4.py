"""Gemma 4's reasoning (``--reasoning-parser gemma4``, vLLM's name): with thinking on (the template's
``enable_thinking``), the output opens a thought channel, ``<|channel>thought\\n…<channel|>``, and the answer follows.
The channel's ``thought`` label and the line break after it are not reasoning (vLLM's parser drops them too). An
output without ``<channel|>`` is all content; with thinking off the template closes an empty channel in the prompt
itself, so every output is content (``PreparedRequest.reasoning_closed``).

Streaming is Qwen3's (:class:`~services.gateway.openai.reasoning.think_stream.ThinkStream`, with Gemma 4's markers)
with the label held back at the start of the reasoning until it is known to be there or not. As Qwen3's, a stream
cannot wait for a ``<channel|>`` that may never come: text of an output that did not open the channel streams as
content, where :meth:`Gemma4ReasoningParser.split` reads the text before a ``<channel|>`` as reasoning. Newer Gemma 4
templates open the channel in the prompt after a tool's result when thinking is on: such a turn's output is read as
after ``<|channel>`` (:class:`~services.gateway.openai.reasoning.opened.OpenedReasoning`), so its thought streams as
reasoning.
"""

from __future__ import annotations

from services.gateway.openai.reasoning.markers import strip_leading_newlines
from services.gateway.openai.reasoning.think_stream import ThinkStream
from services.gateway.openai.reasoning.types import ReasoningSplit, ReasoningStream

START, END = "<|channel>", "<channel|>"
LABEL = "thought\n"


def _without_label(reasoning: str) -> str:
    return reasoning[len(LABEL):] if reasoning.startswith(LABEL) else reasoning


class Gemma4ReasoningParser:
    name = "gemma4"
    start_marker = START
    end_marker = END
    markers = (START, END)

    def split(self, text: str) -> ReasoningSplit:
        before, found, after = text.partition(END)
        if not found:
            return ReasoningSplit(content=text)
        if before.startswith(START):
            before = before[len(START):]
        return ReasoningSplit(reasoning=_without_label(before), content=strip_leading_newlines(after))

    def stream(self) -> ReasoningStream:
        return _LabelledStream()


class _LabelledStream:
    """:class:`ThinkStream` over Gemma 4's markers, its reasoning without the channel's label."""

    def __init__(self) -> None:
        self._inner = ThinkStream(unopened="content", start=START, end=END)
        self._head = ""  # the reasoning so far while it may still be (the start of) the label
        self._decided = False

    def feed(self, text: str) -> ReasoningSplit:
        return self._strip(self._inner.feed(text), final=False)

    def finish(self) -> ReasoningSplit:
        return self._strip(self._inner.finish(), final=True)

    def _strip(self, split: ReasoningSplit, final: bool) -> ReasoningSplit:
        if self._decided or not (split.reasoning or split.content or final):
            return split
        head = self._head + split.reasoning
        if LABEL.startswith(head) and not split.content and not final:  # it may yet be the label
            self._head = head
            return ReasoningSplit()
        self._decided, self._head = True, ""
        return ReasoningSplit(reasoning=_without_label(head), content=split.content)

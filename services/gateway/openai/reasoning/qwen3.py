"""Qwen3's reasoning (``--reasoning-parser qwen3``): the output may open with ``<think>``; the text up to
``</think>`` is the reasoning, what follows the answer (its leading line breaks dropped). An output with no
``</think>`` is all content: the model did not think (thinking switched off in the template, or a template
that writes ``<think></think>`` into the prompt).

Streaming (:meth:`Qwen3ReasoningParser.stream`) gives the same split as :meth:`split` for any chunking of a
well-formed output: one that opens with ``<think>`` and closes it, or one with neither marker. Before any
``</think>`` is seen a stream cannot know whether one will come, so it decides as vLLM does: text inside an
opened ``<think>`` is reasoning, text of an output that did not open one is content. Two ill-formed outputs
therefore differ from :meth:`split`: an opened ``<think>`` never closed (cut by ``max_tokens``) streams as
reasoning, and text before a ``</think>`` that was never opened streams as content; in both the marker text
itself is never streamed.
"""

from __future__ import annotations

from services.gateway.openai.reasoning.markers import THINK_END, THINK_START, strip_leading_newlines
from services.gateway.openai.reasoning.think_stream import ThinkStream
from services.gateway.openai.reasoning.types import ReasoningSplit, ReasoningStream


class Qwen3ReasoningParser:
    name = "qwen3"
    start_marker = THINK_START
    end_marker = THINK_END
    markers = (THINK_START, THINK_END)

    def split(self, text: str) -> ReasoningSplit:
        before, found, after = text.partition(self.end_marker)
        if not found:
            return ReasoningSplit(content=text)
        if before.startswith(self.start_marker):
            before = before[len(self.start_marker):]
        return ReasoningSplit(reasoning=before, content=strip_leading_newlines(after))

    def stream(self) -> ReasoningStream:
        return ThinkStream(unopened="content", start=self.start_marker, end=self.end_marker)


class Glm45ReasoningParser(Qwen3ReasoningParser):
    """GLM-4.5's, 4.5-Air's and 4.6's (``--reasoning-parser glm45``, vLLM's name): their outputs think as Qwen3's,
    opening ``<think>`` themselves (the template writes ``<think></think>`` into the prompt when thinking is off)."""

    name = "glm45"

"""DeepSeek-R1's reasoning (``--reasoning-parser deepseek_r1``): its chat template opens ``<think>`` in the
prompt, so the output starts inside the thinking. The text before ``</think>`` is the reasoning (a leading
``<think>`` dropped when the model writes one anyway), what follows the answer (its leading line breaks
dropped); an output with no ``</think>`` is all reasoning (cut before the model finished thinking).

Streaming gives exactly the split of :meth:`DeepSeekR1ReasoningParser.split` for any chunking: before
``</think>`` everything is reasoning, so nothing waits for the future.
"""

from __future__ import annotations

from services.gateway.openai.reasoning.markers import THINK_END, THINK_START, strip_leading_newlines
from services.gateway.openai.reasoning.think_stream import ThinkStream
from services.gateway.openai.reasoning.types import ReasoningSplit, ReasoningStream


class DeepSeekR1ReasoningParser:
    name = "deepseek_r1"
    start_marker = THINK_START
    end_marker = THINK_END
    markers = (THINK_START, THINK_END)

    def split(self, text: str) -> ReasoningSplit:
        if text.startswith(THINK_START):
            text = text[len(THINK_START):]
        before, found, after = text.partition(THINK_END)
        return ReasoningSplit(reasoning=before, content=strip_leading_newlines(after) if found else "")

    def stream(self) -> ReasoningStream:
        return ThinkStream(unopened="reasoning")

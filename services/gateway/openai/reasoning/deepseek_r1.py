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
        if text.startswith(self.start_marker):
            text = text[len(self.start_marker):]
        before, found, after = text.partition(self.end_marker)
        return ReasoningSplit(reasoning=before, content=strip_leading_newlines(after) if found else "")

    def stream(self) -> ReasoningStream:
        return ThinkStream(unopened="reasoning", start=self.start_marker, end=self.end_marker)


class MiniMaxM2ReasoningParser(DeepSeekR1ReasoningParser):
    """MiniMax-M2's (``--reasoning-parser minimax_m2``, vLLM's name): its template opens ``<think>`` in the prompt,
    as DeepSeek-R1's does."""

    name = "minimax_m2"


class SeedOssReasoningParser(DeepSeekR1ReasoningParser):
    """Seed-OSS's (``--reasoning-parser seed_oss``, vLLM's name): DeepSeek-R1's split with ``<seed:think>`` and
    ``</seed:think>`` (its template may open the thinking in the prompt; its thinking-budget reflections inside
    stay reasoning)."""

    name = "seed_oss"
    start_marker = "<seed:think>"
    end_marker = "</seed:think>"
    markers = (start_marker, end_marker)

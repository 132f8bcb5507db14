"""Magistral's reasoning (``--reasoning-parser mistral``, vLLM's name): Qwen3's split of ``[THINK]…[/THINK]``. The
model opens ``[THINK]`` itself (its system prompt asks it to); an output without ``[/THINK]`` is all content. Both
markers are special tokens of Mistral's tokenizers: the front decodes them (``Tokenizer.keep_special_tokens``)."""

from __future__ import annotations

from services.gateway.openai.reasoning.qwen3 import Qwen3ReasoningParser


class MistralReasoningParser(Qwen3ReasoningParser):
    name = "mistral"
    start_marker = "[THINK]"
    end_marker = "[/THINK]"
    markers = (start_marker, end_marker)

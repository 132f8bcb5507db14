"""What one request at the gateway has sent its client, and when: the chunks' tokens and text, the timing.

:class:`ClientOutput` keeps every token the nodes sent (a resume hands them to the next decode node),
turns them into text through :class:`CompletionText` (stop strings included: the caller stops the nodes
when a batch completes one), builds the ``GenerateChunk``s (none for a batch that adds nothing; no
logprobs past a stop string), holds the ``detokenize`` span from the first token to the end (not a span per
token), and writes the ``request finished`` log line (time to first token, duration, decode rate).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span

from services.common import tracing
from services.engine.logprobs import TokenLogprobs
from services.engine.tokenizer import Tokenizer
from services.gateway.completion_text import CompletionText, TextDelta
from services.gateway.generation import GenerateChunk, PreparedRequest


class ClientOutput:
    def __init__(self, request: PreparedRequest, tokenizer: Tokenizer, trace: Context | None) -> None:
        """``trace``: the Generate span's context, parent of the ``detokenize`` span (None: tracing off)."""
        self.request_id = request.request_id
        self.generated: list[int] = []  # every token the nodes sent (a resume hands them over)
        self.first_sent = False
        self._text = CompletionText(tokenizer, request.sampling, len(request.prompt_ids))
        self._trace = trace
        self._detokenize: Span | None = None  # from the first token to the end (not a span per token)
        self._started = time.monotonic()  # the flow opens once the request is tokenized and valid
        self._first_token_at: float | None = None

    def first_token(self, cached_tokens: int) -> None:
        """The first token goes to the client now; ``cached_tokens``: the prompt's tokens found cached."""
        self._text.cached_tokens = cached_tokens
        self.first_sent = True
        self._first_token_at = time.monotonic()

    def add(self, token_ids: Sequence[int], finish_reason: str, first: bool = False) -> TextDelta:
        """Tokens from a node (``first``: the first token's batch): kept, and what they add to the text."""
        self.generated.extend(token_ids)
        if first and self._trace is not None:
            self._detokenize = tracing.start_span("detokenize", self._trace, request_id=self.request_id)
        return self._text.add(token_ids, finish_reason)

    def chunk(self, delta: TextDelta, logprobs: Sequence[TokenLogprobs] = (), prefill_node: str = "",
              decode_node: str = "", prompt_logprobs: Sequence[TokenLogprobs] = ()) -> GenerateChunk | None:
        """The chunk for ``delta`` (None when it adds nothing), with ``usage`` once it finishes."""
        if delta.empty:
            return None
        return GenerateChunk(
            self.request_id, delta.token_ids, delta.text, delta.finish_reason,
            self._text.usage() if delta.finish_reason else None, prefill_node=prefill_node, decode_node=decode_node,
            logprobs=tuple(logprobs[:len(delta.token_ids)]),  # none past a stop string
            prompt_logprobs=tuple(prompt_logprobs),
            stop_string=self._text.matched_stop if delta.finish_reason == "stop" else None)

    def end_detokenize(self) -> None:
        span, self._detokenize = self._detokenize, None
        if span is not None:
            span.set_attribute("pdserve.completion_tokens", self._text.completion_tokens)
            span.end()

    def log_finish(self, log: Any, chunk: GenerateChunk, prefill_node: str, decode_node: str) -> None:
        """``request finished`` on ``log`` for the final ``chunk``."""
        usage = chunk.usage
        assert usage is not None, "a final chunk carries usage"
        now = time.monotonic()
        first = self._first_token_at if self._first_token_at is not None else now
        decoding_s = now - first
        log.info("request finished", finish_reason=chunk.finish_reason, prompt_tokens=usage.prompt_tokens,
                 completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
                 ttft_ms=round((first - self._started) * 1000, 1), duration_ms=self.elapsed_ms(),
                 decode_tokens_per_s=round((usage.completion_tokens - 1) / decoding_s, 1) if decoding_s > 0
                 else None, prefill_node=prefill_node, decode_node=decode_node)

    def elapsed_ms(self) -> float:
        """Milliseconds since the flow opened."""
        return round((time.monotonic() - self._started) * 1000, 1)

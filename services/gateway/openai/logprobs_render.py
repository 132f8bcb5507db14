"""Token logprobs in OpenAI's two shapes: the completions' parallel lists and the chat's per-token objects.

A token's text is its own decode (special tokens included, a split UTF-8 character as ``\\ufffd``, as
vLLM shows them); ``bytes`` are that text's UTF-8 bytes. Completions' ``top_logprobs`` hold the token
itself and the ``k`` most likely (vLLM's shape); ``text_offset`` counts from the start of the completion.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.engine.logprobs import TokenLogprobs
from services.engine.tokenizer import Tokenizer
from services.gateway.openai import responses as out


class LogprobsRender:
    """Renders the logprobs of one request's tokens, chunk after chunk (``text_offset`` runs on)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._offset = 0

    def text(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def completion(self, logprobs: Sequence[TokenLogprobs]) -> out.CompletionLogprobs:
        tokens, offsets = [], []
        for lp in logprobs:
            tokens.append(self.text(lp.token_id))
            offsets.append(self._offset)
            self._offset += len(tokens[-1])
        return out.CompletionLogprobs(
            tokens=tokens, token_logprobs=[lp.logprob for lp in logprobs],
            top_logprobs=[{token: lp.logprob} | {self.text(t): v for t, v in lp.top}
                          for token, lp in zip(tokens, logprobs, strict=True)],
            text_offset=offsets)

    def chat(self, logprobs: Sequence[TokenLogprobs]) -> out.ChatLogprobs:
        def top(token_id: int, value: float) -> out.TopLogprobOut:
            text = self.text(token_id)
            return out.TopLogprobOut(token=text, logprob=value, bytes=list(text.encode()))

        content = []
        for lp in logprobs:
            text = self.text(lp.token_id)
            content.append(out.ChatTokenLogprob(token=text, logprob=lp.logprob, bytes=list(text.encode()),
                                                top_logprobs=[top(t, v) for t, v in lp.top]))
        return out.ChatLogprobs(content=content)

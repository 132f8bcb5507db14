"""Token logprobs in OpenAI's two shapes: the completions' parallel lists and the chat's per-token objects.

A token's text is its own decode (special tokens included, a split UTF-8 character as ``\\ufffd``, as
vLLM shows them); ``bytes`` are the bytes the token stands for, so the pieces of a split character join
back into it (vLLM gives the UTF-8 of ``\\ufffd``). Completions' ``top_logprobs`` hold the token itself
and the ``k`` most likely (vLLM's shape); ``text_offset`` is the character of the completion's text where
the token's bytes begin (the tokens of one split character share its offset, and none points past the
text, as adding up ``len("\\ufffd")`` did).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from services.engine.logprobs import TokenLogprobs
from services.engine.tokenizer import Tokenizer
from services.gateway.openai import responses as out


class LogprobsRender:
    """Renders the logprobs of one request's tokens, chunk after chunk (``text_offset`` runs on)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._offset = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds a split character back

    def text(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def completion(self, logprobs: Sequence[TokenLogprobs]) -> out.CompletionLogprobs:
        tokens, offsets = [], []
        for lp in logprobs:
            tokens.append(self.text(lp.token_id))
            offsets.append(self._offset)
            self._offset += len(self._utf8.decode(self._tokenizer.token_bytes(lp.token_id)))
        return out.CompletionLogprobs(
            tokens=tokens, token_logprobs=[lp.logprob for lp in logprobs],
            top_logprobs=[{token: lp.logprob} | {self.text(t): v for t, v in lp.top}
                          for token, lp in zip(tokens, logprobs, strict=True)],
            text_offset=offsets)

    def chat(self, logprobs: Sequence[TokenLogprobs]) -> out.ChatLogprobs:
        def top(token_id: int, value: float) -> out.TopLogprobOut:
            return out.TopLogprobOut(token=self.text(token_id), logprob=value,
                                     bytes=list(self._tokenizer.token_bytes(token_id)))

        content = []
        for lp in logprobs:
            content.append(out.ChatTokenLogprob(token=self.text(lp.token_id), logprob=lp.logprob,
                                                bytes=list(self._tokenizer.token_bytes(lp.token_id)),
                                                top_logprobs=[top(t, v) for t, v in lp.top]))
        return out.ChatLogprobs(content=content)

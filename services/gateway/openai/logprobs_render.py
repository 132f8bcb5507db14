"""Token logprobs in OpenAI's two shapes: the completions' parallel lists and the chat's per-token objects.

A token's text is its own decode (special tokens included, a split UTF-8 character as ``\\ufffd``, as
vLLM shows them); ``bytes`` are the bytes the token stands for, so the pieces of a split character join
back into it (vLLM gives the UTF-8 of ``\\ufffd``). Completions' ``top_logprobs`` hold the token itself
and the ``k`` most likely (vLLM's shape); ``text_offset`` is the character of the completion's text where
the token's bytes begin (the tokens of one split character share its offset, and none points past the
text, as adding up ``len("\\ufffd")`` did). With vLLM's ``return_tokens_as_token_ids`` every token is named
``token_id:<id>`` instead of its text (the text cannot tell apart tokens that decode alike); ``bytes`` and
``text_offset`` stay those of the token's bytes.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from services.engine.logprobs import TokenLogprobs
from services.engine.tokenizer import Tokenizer
from services.gateway.openai import responses as out


class LogprobsRender:
    """Renders the logprobs of one request's tokens, chunk after chunk (``text_offset`` runs on)."""

    def __init__(self, tokenizer: Tokenizer, as_token_ids: bool = False) -> None:
        self._tokenizer, self._as_token_ids = tokenizer, as_token_ids
        self._offset = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds a split character back

    def text(self, token_id: int) -> str:
        if self._as_token_ids:
            return f"token_id:{token_id}"
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def completion(self, logprobs: Sequence[TokenLogprobs], k: int | None = None) -> out.CompletionLogprobs:
        """``k``: at most that many of each token's most likely (None: all it has)."""
        tokens, offsets = self._tokens([lp.token_id for lp in logprobs])
        return out.CompletionLogprobs(
            tokens=tokens, token_logprobs=[lp.logprob for lp in logprobs],
            top_logprobs=[{token: lp.logprob} | {self.text(t): v for t, v in lp.top[:k]}
                          for token, lp in zip(tokens, logprobs, strict=True)],
            text_offset=offsets)

    def echoed_prompt(self, prompt_ids: Sequence[int], logprobs: Sequence[TokenLogprobs], k: int
                      ) -> out.CompletionLogprobs:
        """An echoed prompt's tokens (``logprobs``: of all but the first, which nothing predicts: None), at
        the start of the text; ``k`` most likely each."""
        first, offsets = self._tokens(prompt_ids[:1])
        rest = self.completion(logprobs, k)
        return out.CompletionLogprobs(tokens=first + rest.tokens, token_logprobs=[None, *rest.token_logprobs],
                                      top_logprobs=[None, *rest.top_logprobs], text_offset=offsets + rest.text_offset)

    def _tokens(self, token_ids: Sequence[int]) -> tuple[list[str], list[int]]:
        """Their texts and offsets (the text runs on from the last call's)."""
        tokens, offsets = [], []
        for token_id in token_ids:
            tokens.append(self.text(token_id))
            offsets.append(self._offset)
            self._offset += len(self._utf8.decode(self._tokenizer.token_bytes(token_id)))
        return tokens, offsets

    def vllm_prompt(self, logprobs: Sequence[TokenLogprobs], k: int) -> list[dict[str, out.PromptLogprob] | None]:
        """vLLM's ``prompt_logprobs``: None for the first prompt token, then {token id: entry} of each token
        and its ``k`` most likely."""
        def entry(value: float, rank: int | None, token_id: int) -> out.PromptLogprob:
            return out.PromptLogprob(logprob=value, rank=rank, decoded_token=self.text(token_id))

        shown: list[dict[str, out.PromptLogprob] | None] = [None]
        for lp in logprobs:
            top = {str(t): entry(v, i, t) for i, (t, v) in enumerate(lp.top[:k], 1)}
            shown.append({str(lp.token_id): entry(lp.logprob, lp.rank or None, lp.token_id)} | top)
        return shown

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

"""Turning a client's request into prompt token ids, and checking it before any state changes.

Shared by the mixed engine and the gateway, so a bad request gets the same ``InvalidRequestError``
(naming the field) wherever it enters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.engine.bad_words import BadWordIds, bad_word_ids
from services.engine.chat_template import DEFAULT_OPTIONS, ChatTemplateOptions
from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams, require_utf8
from services.engine.structured_spec import StructuredSpec
from services.engine.tokenizer import ChatMessage, Tokenizer

_CUT_MARGIN_TOKENS = 16  # a text cut for truncation keeps this many tokens' characters more than it needs


@dataclass(frozen=True)
class RequestValidator:
    vocab_size: int
    max_model_len: int
    tokenizer: Tokenizer | None = None
    kv_capacity_tokens: int | None = None  # a request must fit the KV pool on its own
    # compiles a constrained request's spec, raising InvalidRequestError (the engine's check_structured, or
    # StructuredCompiler(tokenizer, vocab_size).check); None: only the spec's shape is checked
    structured_check: Callable[[StructuredSpec], None] | None = None
    # the ids the model's head scores, where fewer than the vocabulary (a pruned head: Apertus 1.5's); None: all
    head_rows: int | None = None

    def encode_prompt(self, prompt: str | None = None, token_ids: Sequence[int] | None = None,
                      messages: Sequence[ChatMessage] | None = None,
                      tools: Sequence[Mapping[str, Any]] = (), template: ChatTemplateOptions = DEFAULT_OPTIONS,
                      keep_last: int | None = None) -> list[int]:
        """Token ids of exactly one of a text prompt, token ids, or chat messages (templated with ``template``'s
        options, and ``tools``: OpenAI tool definitions the template renders). ``keep_last`` (vLLM's
        ``truncate_prompt_tokens``): only the last that many, -1 = the context's length; None = all."""
        if keep_last is not None:
            if not 1 <= keep_last <= self.max_model_len:
                raise InvalidRequestError("truncate_prompt_tokens", f"must be -1 (the context's room) or in "
                                                                    f"[1, {self.max_model_len}], got {keep_last}")
            if token_ids is not None:
                token_ids = token_ids[-keep_last:]
        given = [name for name, value in (("prompt", prompt), ("token_ids", token_ids), ("messages", messages))
                 if value is not None and (len(value) > 0 or name != "messages")]
        if len(given) != 1:
            raise InvalidRequestError(
                "prompt", f"exactly one of prompt, token_ids, messages must be given (got {', '.join(given) or 'none'})"
            )
        if token_ids is not None:
            if len(token_ids) >= self.max_model_len:  # before any copy or scan: millions of ids take seconds
                raise self._past_the_context(len(token_ids))
            ids, field = [int(t) for t in token_ids], "token_ids"
        elif self.tokenizer is None:
            raise InvalidRequestError(given[0], "this node has no tokenizer; send token_ids")
        elif prompt is not None:
            if keep_last is not None:  # what cannot reach the last keep_last tokens is not tokenized
                prompt = prompt[-(keep_last + _CUT_MARGIN_TOKENS) * self.tokenizer.max_token_chars:]
            self._refuse_text_past_any_context("prompt", len(prompt))
            require_utf8("prompt", prompt)
            ids, field = self.tokenizer.encode(prompt), "prompt"
            if keep_last is not None:
                head = len(self.tokenizer.encode(""))  # the special tokens it puts first (BOS): kept
                if keep_last <= head:
                    raise InvalidRequestError("truncate_prompt_tokens", f"must leave room for the prompt: its "
                                                                        f"tokenizer adds {head} token(s) first")
                ids = ids[:head] + ids[head:][-(keep_last - head):] if len(ids) > keep_last else ids
        else:
            if len(messages) >= self.max_model_len:  # the characters say nothing of the template's own tokens
                raise InvalidRequestError("messages", f"{len(messages)} messages cannot fit a context of "
                                                      f"{self.max_model_len} tokens (each takes at least one)")
            self._refuse_text_past_any_context("messages", sum(len(m.content) for m in messages))
            for i, message in enumerate(messages):
                require_utf8(f"messages[{i}].content", message.content)
            ids, field = self.tokenizer.apply_chat_template(messages, tools, template), "messages"
        if keep_last is not None and field != "prompt":
            ids = ids[-keep_last:]
        if not ids:
            raise InvalidRequestError(field, "is empty")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(field, f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return ids

    def _past_the_context(self, tokens: int) -> InvalidRequestError:
        return InvalidRequestError("prompt", f"{tokens} tokens do not fit the context of {self.max_model_len} "
                                             f"tokens with room to generate")

    def _refuse_text_past_any_context(self, field: str, chars: int) -> None:
        """Tokenizing megabytes takes seconds on the caller's thread: refuse a text that cannot fit the
        context whatever its tokens. (A normalizer that deletes characters could make a longer text fit;
        the byte-level and sentencepiece tokenizers of Llama-family models have none.)"""
        assert self.tokenizer is not None
        limit = self.max_model_len * self.tokenizer.max_token_chars
        if chars > limit:
            raise InvalidRequestError(field, f"is {chars} characters, more than any prompt of at most "
                                             f"{self.max_model_len} tokens can have ({limit})")

    def bad_word_ids(self, sampling: SamplingParams) -> BadWordIds:
        """``sampling.bad_words`` as token sequences (:mod:`services.engine.bad_words`), for the request's
        ``bad_word_ids``; every node that samples for the request derives them from its own tokenizer."""
        if not sampling.bad_words:
            return ()
        if self.tokenizer is None:
            raise InvalidRequestError("bad_words", "bad words need a tokenizer")
        return bad_word_ids(sampling.bad_words, self.tokenizer.encode_plain, self.vocab_size)

    def validate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *, prefill_only: bool = False
                 ) -> BadWordIds:
        """``prefill_only`` (a prefill node's request): this pool holds the prompt and the first new token
        only; whether the whole generation fits is the decode node's question (its ``Reserve``). Returns the
        request's bad-word sequences (:meth:`bad_word_ids`, derived while checking them) for its ``Request``."""
        sampling.validate(self.vocab_size)
        if self.head_rows is not None and sampling.allowed_token_ids and \
                min(sampling.allowed_token_ids) >= self.head_rows:
            raise InvalidRequestError("allowed_token_ids", f"none of them can be sampled: the model's head scores "
                                                           f"the ids [0, {self.head_rows}) only")
        if sampling.stop and self.tokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer")
        bad_words = self.bad_word_ids(sampling)
        n, limit = len(prompt_ids), self.max_model_len
        if n >= limit:
            raise self._past_the_context(n)
        if n + sampling.max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens", f"{n} prompt + {sampling.max_tokens} new tokens exceed the context of {limit} tokens"
            )
        capacity = self.kv_capacity_tokens
        if capacity is not None and prefill_only and n + 1 > capacity:
            raise InvalidRequestError("prompt", f"{n} prompt tokens and the first new one exceed the KV pool of "
                                                f"{capacity} tokens")
        if capacity is not None and not prefill_only and n + sampling.max_tokens > capacity:
            raise InvalidRequestError(
                "max_tokens", f"{n} prompt + {sampling.max_tokens} new tokens exceed the KV pool of {capacity} tokens"
            )
        if sampling.structured is not None and self.structured_check is not None:  # last: the costliest check
            self.structured_check(sampling.structured)
        return bad_words

"""OpenAI request bodies → ``GenerateInput``; ``GenerateChunk``s → OpenAI response bodies.

Sampling maps one to one onto the gateway's ``SamplingFields`` (unset stays unset, so the gateway's
defaults apply: ``max_tokens = min(--default-max-tokens, room left in the context)``, temperature 1,
top_p 1, a random seed). A renderer turns the chunks of one request into the endpoint's bodies: streamed
chunks (empty text is not sent, except where a chunk must be: the chat role, the finish), the usage
chunk, or the whole response.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from services.common.sampling_convert import SamplingFields
from services.engine.logprobs import TokenLogprobs
from services.engine.sampling_params import SEED_LIMIT
from services.engine.tokenizer import ChatMessage
from services.gateway.generation import GenerateChunk, GenerateInput, Usage
from services.gateway.openai import responses as out
from services.gateway.openai.logprobs_render import LogprobsRender
from services.gateway.openai.schemas import ChatCompletionBody, CompletionBody, GenerationBody
from services.gateway.openai.structured import structured_of

# Sampling fields a body does not carry as SamplingFields has them: the endpoints' (max_tokens, logprobs) and
# the reshaped ones; every other field of SamplingFields the body declares is taken by name.
_NOT_BY_NAME = ("max_tokens", "logprobs", "stop", "stop_token_ids", "logit_bias",
                "structured")  # structured: from response_format, guided_*, structured_outputs (structured.py)
_BY_NAME = tuple(f.name for f in dataclasses.fields(SamplingFields)
                 if f.name in GenerationBody.model_fields and f.name not in _NOT_BY_NAME)


def sampling_of(body: GenerationBody, max_tokens: int | None, logprobs: int | None = None) -> SamplingFields:
    return SamplingFields(**{name: getattr(body, name) for name in _BY_NAME},
                          max_tokens=max_tokens, logprobs=logprobs, stop=tuple(body.stop or ()),
                          stop_token_ids=tuple(body.stop_token_ids or ()),
                          logit_bias=tuple((int(token), bias) for token, bias in (body.logit_bias or {}).items()),
                          structured=structured_of(body))


def completion_inputs(body: CompletionBody, request_id: str) -> list[GenerateInput]:
    """One input per prompt of the body (a batch has several), each under ``request_id``."""
    sampling = sampling_of(body, body.max_tokens, body.logprobs)
    return [GenerateInput(request_id=request_id, prompt=prompt if isinstance(prompt, str) else None,
                          token_ids=None if isinstance(prompt, str) else tuple(prompt), sampling=sampling)
            for prompt in body.prompt]


def chat_input(body: ChatCompletionBody, request_id: str) -> GenerateInput:
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return GenerateInput(request_id=request_id, messages=tuple(ChatMessage(m.role, m.text) for m in body.messages),
                         sampling=sampling_of(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None))


def choices_of(prompts: Sequence[GenerateInput], n: int) -> list[GenerateInput]:
    """The requests of ``n`` choices of each prompt, prompt by prompt: choice ``i`` of prompt ``p`` is
    ``choices[p * n + i]`` (its index in the response, as OpenAI and vLLM number a batch) with id
    ``<id>-<p * n + i>``; a given seed becomes ``seed + i``, so that seeded choices differ yet reproduce, and
    each prompt of a batch gets what it would alone (no seed: each draws its own). One prompt, one choice:
    the request as it is."""
    if len(prompts) == 1 and n == 1:
        return list(prompts)
    choices = []
    for p, generate in enumerate(prompts):
        seed = generate.sampling.seed
        choices += [dataclasses.replace(generate, request_id=f"{generate.request_id}-{p * n + i}",
                                        sampling=dataclasses.replace(generate.sampling, seed=None if seed is None
                                                                     else (seed + i) % SEED_LIMIT))
                    for i in range(n)]
    return choices


def usage_body(usage: Usage) -> out.UsageBody:
    return out.UsageBody(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                         total_tokens=usage.prompt_tokens + usage.completion_tokens,
                         prompt_tokens_details=out.PromptTokensDetails(cached_tokens=usage.cached_tokens))


class Renderer(Protocol):
    """The bodies of one request's response."""

    def chunk(self, chunk: GenerateChunk, first: bool) -> BaseModel | None:
        """A streamed chunk for ``chunk`` (None: nothing to send)."""

    def usage_chunk(self, usage: Usage) -> BaseModel:
        """The last streamed chunk when ``stream_options.include_usage``: no choices, the usage."""

    def whole(self, text: str, finish_reason: str, usage: Usage, logprobs: Sequence[TokenLogprobs] = ()
              ) -> BaseModel:
        """The non-streamed response (``logprobs``: of every token, when the request asked for them)."""


@dataclass(frozen=True)
class Identity:
    id: str
    model: str
    created: int

    @classmethod
    def new(cls, request_id: str, model: str) -> Identity:
        return cls(request_id, model, int(time.time()))


@dataclass(frozen=True)
class CompletionRenderer:
    who: Identity
    logprobs: LogprobsRender | None = None  # the request asked for logprobs
    index: int = 0  # of the choice, among the request's n

    def chunk(self, chunk: GenerateChunk, first: bool) -> out.Completion | None:
        if not chunk.text and not chunk.finish_reason and not chunk.logprobs:
            return None
        choice = out.CompletionChoice(index=self.index, text=chunk.text, finish_reason=chunk.finish_reason or None,
                                      logprobs=self._logprobs(chunk.logprobs))
        return out.Completion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[choice])

    def _logprobs(self, logprobs: Sequence[TokenLogprobs]) -> out.CompletionLogprobs | None:
        return self.logprobs.completion(logprobs) if self.logprobs is not None else None

    def usage_chunk(self, usage: Usage) -> out.Completion:
        return out.Completion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[],
                              usage=usage_body(usage))

    def whole(self, text: str, finish_reason: str, usage: Usage, logprobs: Sequence[TokenLogprobs] = ()
              ) -> out.Completion:
        choice = out.CompletionChoice(index=self.index, text=text, finish_reason=finish_reason,
                                      logprobs=self._logprobs(logprobs))
        return out.Completion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[choice],
                              usage=usage_body(usage))


@dataclass(frozen=True)
class ChatRenderer:
    who: Identity
    logprobs: LogprobsRender | None = None  # the request asked for logprobs
    index: int = 0  # of the choice, among the request's n

    def chunk(self, chunk: GenerateChunk, first: bool) -> out.ChatCompletionChunk | None:
        if not chunk.text and not chunk.finish_reason and not first and not chunk.logprobs:
            return None
        delta = out.ChatDelta(role="assistant" if first else None,
                              content=chunk.text if chunk.text or first else None)
        choice = out.ChatChunkChoice(index=self.index, delta=delta, finish_reason=chunk.finish_reason or None,
                                     logprobs=self._logprobs(chunk.logprobs))
        return out.ChatCompletionChunk(id=self.who.id, created=self.who.created, model=self.who.model,
                                       choices=[choice])

    def _logprobs(self, logprobs: Sequence[TokenLogprobs]) -> out.ChatLogprobs | None:
        return self.logprobs.chat(logprobs) if self.logprobs is not None else None

    def usage_chunk(self, usage: Usage) -> out.ChatCompletionChunk:
        return out.ChatCompletionChunk(id=self.who.id, created=self.who.created, model=self.who.model, choices=[],
                                       usage=usage_body(usage))

    def whole(self, text: str, finish_reason: str, usage: Usage, logprobs: Sequence[TokenLogprobs] = ()
              ) -> out.ChatCompletion:
        choice = out.ChatChoice(index=self.index, message=out.ChatMessageOut(content=text),
                                finish_reason=finish_reason, logprobs=self._logprobs(logprobs))
        return out.ChatCompletion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[choice],
                                  usage=usage_body(usage))

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
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Protocol

from pydantic import BaseModel

from services.common.sampling_convert import SamplingFields
from services.engine.logprobs import TokenLogprobs
from services.engine.sampling_params import SEED_LIMIT
from services.engine.structured_spec import StructuredSpec
from services.gateway.generation import GenerateChunk, GenerateInput, Usage
from services.gateway.openai import responses as out
from services.gateway.openai.logprobs_render import LogprobsRender
from services.gateway.openai.output_split import Delta, OutputSplit, StreamSplit
from services.gateway.openai.parsers import FrontParsers
from services.gateway.openai.schemas import ChatCompletionBody, CompletionBody, GenerationBody
from services.gateway.openai.structured import structured_of
from services.gateway.openai.tool_calling import ToolRequest, constraint_of, template_inputs, tool_request_of
from services.gateway.openai.tools.types import ParsedToolCall, ToolCallParser

# Sampling fields a body does not carry as SamplingFields has them: the endpoints' (max_tokens, logprobs) and
# the reshaped ones; every other field of SamplingFields the body declares is taken by name.
_NOT_BY_NAME = ("max_tokens", "logprobs", "prompt_logprobs", "stop", "stop_token_ids", "allowed_token_ids",
                "logit_bias", "bad_words",
                "structured")  # structured: from response_format, guided_*, structured_outputs (structured.py)
_BY_NAME = tuple(f.name for f in dataclasses.fields(SamplingFields)
                 if f.name in GenerationBody.model_fields and f.name not in _NOT_BY_NAME)


def sampling_of(body: GenerationBody, max_tokens: int | None, logprobs: int | None = None,
                structured: StructuredSpec | EllipsisType | None = ..., prompt_logprobs: int | None = None
                ) -> SamplingFields:
    """``structured``: the output constraint (``...``: the body's, :func:`structured_of`)."""
    return SamplingFields(**{name: getattr(body, name) for name in _BY_NAME},
                          max_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                          stop=tuple(body.stop or ()),
                          stop_token_ids=tuple(body.stop_token_ids or ()),
                          allowed_token_ids=tuple(body.allowed_token_ids or ()),
                          bad_words=tuple(body.bad_words or ()),
                          logit_bias=tuple((int(token), bias) for token, bias in (body.logit_bias or {}).items()),
                          structured=structured_of(body) if isinstance(structured, EllipsisType) else structured)


def prompt_logprobs_of(body: CompletionBody) -> int | None:
    """The prompt logprobs a completion asks for: vLLM's ``prompt_logprobs``, and with ``echo`` its
    ``logprobs`` (the echoed prompt's tokens have theirs, as vLLM); the larger k of the two."""
    asked = [k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None]
    return max(asked) if asked else None


def after_reasoning(spec: StructuredSpec | None, end_ids: tuple[int, ...]) -> StructuredSpec | None:
    """With a reasoning parser (``end_ids``: its end marker's tokens), a constraint applies after the
    thinking: the output is free until those tokens."""
    return spec if spec is None or not end_ids else dataclasses.replace(spec, starts_after_token_ids=end_ids)


def completion_inputs(body: CompletionBody, request_id: str, reasoning_end_ids: tuple[int, ...] = ()
                      ) -> list[GenerateInput]:
    """One input per prompt of the body (a batch has several), each under ``request_id``."""
    sampling = sampling_of(body, body.max_tokens, body.logprobs, after_reasoning(structured_of(body),
                                                                                  reasoning_end_ids),
                           prompt_logprobs=prompt_logprobs_of(body))
    return [GenerateInput(request_id=request_id, prompt=prompt if isinstance(prompt, str) else None,
                          truncate_prompt_tokens=body.truncate_prompt_tokens,
                          token_ids=None if isinstance(prompt, str) else tuple(prompt), sampling=sampling)
            for prompt in body.prompt]


def chat_input(body: ChatCompletionBody, request_id: str, parsers: FrontParsers | None = None,
               tools: ToolRequest | None = None) -> GenerateInput:
    """``parsers``: the front's (None: no tool calling, no reasoning); ``tools``: the body's
    (:func:`tool_request_of`, when the caller has it already)."""
    tools = tools or tool_request_of(body)
    parser = parsers.tools if parsers is not None else None
    if parser is None:
        if tools.offered:
            raise ValueError("tools need the front's tool-call parser")
        structured = structured_of(body)
    else:
        structured = constraint_of(body, tools, parser)
    messages, tool_dicts = template_inputs(body, tools, parser, parsers is not None and parsers.template_takes_tools)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    structured = after_reasoning(structured, parsers.reasoning_end_ids if parsers is not None else ())
    return GenerateInput(request_id=request_id, messages=messages, tools=tool_dicts, template=body.template_options(),
                         truncate_prompt_tokens=body.truncate_prompt_tokens,
                         sampling=sampling_of(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None,
                                              structured, prompt_logprobs=body.prompt_logprobs),
                         reasoning_markers=parsers.reasoning_markers if parsers is not None else None)


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

    def whole(self, text: str, finish_reason: str, usage: Usage, logprobs: Sequence[TokenLogprobs] = (),
              prompt_logprobs: Sequence[TokenLogprobs] = ()) -> BaseModel:
        """The non-streamed response (``logprobs``: of every token, when the request asked for them;
        ``prompt_logprobs``: of the prompt's tokens after the first, when it asked for those)."""


@dataclass(frozen=True)
class Identity:
    id: str
    model: str
    created: int

    @classmethod
    def new(cls, request_id: str, model: str) -> Identity:
        return cls(request_id, model, int(time.time()))


@dataclass(frozen=True)
class PromptShown:
    """What a completion shows of its prompt, in its first chunk: its text first (``echo``; with logprobs,
    its tokens lead the logprobs lists too, the first one's None) and vLLM's ``prompt_logprobs`` (``k``)."""

    ids: tuple[int, ...]
    names: LogprobsRender  # the tokens' texts
    echo_text: str | None = None  # None: not echoed
    echo_logprobs: int | None = None  # the request's logprobs k (the prompt's entries are cut to it)
    prompt_logprobs: int | None = None


@dataclass(frozen=True)
class CompletionRenderer:
    who: Identity
    logprobs: LogprobsRender | None = None  # the request asked for logprobs
    index: int = 0  # of the choice, among the request's n
    prompt: PromptShown | None = None

    def chunk(self, chunk: GenerateChunk, first: bool) -> out.Completion | None:
        if not chunk.text and not chunk.finish_reason and not chunk.logprobs and not first:
            return None
        choice = self._choice(chunk.text, chunk.finish_reason or None, chunk.logprobs,
                              chunk.prompt_logprobs if first else None)
        return out.Completion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[choice])

    def _choice(self, text: str, finish_reason: str | None, logprobs: Sequence[TokenLogprobs],
                prompt_logprobs: Sequence[TokenLogprobs] | None) -> out.CompletionChoice:
        """``prompt_logprobs``: None past the first chunk (the prompt shows once)."""
        prompt = self.prompt if prompt_logprobs is not None else None
        echoed = prompt is not None and prompt.echo_text is not None
        shown = None
        if self.logprobs is not None:
            lists = [self.logprobs.echoed_prompt(prompt.ids, prompt_logprobs, prompt.echo_logprobs)] \
                if echoed and prompt_logprobs is not None and prompt.echo_logprobs is not None else []
            shown = _joined([*lists, self.logprobs.completion(logprobs)])
        if echoed:
            text = prompt.echo_text + text
        vllm_prompt = prompt.names.vllm_prompt(prompt_logprobs, prompt.prompt_logprobs) \
            if prompt is not None and prompt_logprobs is not None and prompt.prompt_logprobs is not None else None
        return out.CompletionChoice(index=self.index, text=text, finish_reason=finish_reason, logprobs=shown,
                                    prompt_logprobs=vllm_prompt)

    def usage_chunk(self, usage: Usage) -> out.Completion:
        return out.Completion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[],
                              usage=usage_body(usage))

    def whole(self, text: str, finish_reason: str, usage: Usage, logprobs: Sequence[TokenLogprobs] = (),
              prompt_logprobs: Sequence[TokenLogprobs] = ()) -> out.Completion:
        choice = self._choice(text, finish_reason, logprobs, prompt_logprobs)
        return out.Completion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[choice],
                              usage=usage_body(usage))


def _joined(parts: Sequence[out.CompletionLogprobs]) -> out.CompletionLogprobs:
    """One set of parallel lists of the parts', in order."""
    if len(parts) == 1:
        return parts[0]
    return out.CompletionLogprobs(tokens=[t for p in parts for t in p.tokens],
                                  token_logprobs=[v for p in parts for v in p.token_logprobs],
                                  top_logprobs=[t for p in parts for t in p.top_logprobs],
                                  text_offset=[o for p in parts for o in p.text_offset])


@dataclass
class ChatRenderer:
    """One choice's chat bodies. ``split``: how its output splits into reasoning, content and calls; the
    calls get ids from ``split.tools``. Streaming keeps state: one renderer per choice."""

    who: Identity
    logprobs: LogprobsRender | None = None  # the request asked for logprobs
    index: int = 0  # of the choice, among the request's n
    split: OutputSplit = field(default_factory=OutputSplit)
    prompt: PromptShown | None = None  # the request asked for vLLM's prompt_logprobs (whole bodies only)
    _stream: StreamSplit | None = field(default=None, init=False, repr=False)
    _calls_sent: int = field(default=0, init=False, repr=False)

    def chunk(self, chunk: GenerateChunk, first: bool) -> out.ChatCompletionChunk | None:
        if self._stream is None:
            self._stream = self.split.stream()
        delta = self._stream.read(chunk.text, last=bool(chunk.finish_reason))
        if not delta and not chunk.finish_reason and not first and not chunk.logprobs:
            return None
        calls = [out.ToolCallDelta(index=self._calls_sent + i, **self._call(call).model_dump())
                 for i, call in enumerate(delta.calls)]
        self._calls_sent += len(calls)
        choice = out.ChatChunkChoice(index=self.index, delta=self._delta(delta, calls, first),
                                     finish_reason=self._finish(chunk.finish_reason, self._calls_sent) or None,
                                     logprobs=self._logprobs(chunk.logprobs))
        return out.ChatCompletionChunk(id=self.who.id, created=self.who.created, model=self.who.model,
                                       choices=[choice])

    def _delta(self, delta: Delta, calls: list[out.ToolCallDelta], first: bool) -> out.ChatDelta:
        bare = first and not delta  # the first chunk says its role, with content "" when nothing else
        return out.ChatDelta(role="assistant" if first else None,
                             content=delta.content if delta.content or bare else None,
                             reasoning_content=delta.reasoning or None, tool_calls=calls or None)

    def _call(self, call: ParsedToolCall) -> out.ToolCallOut:
        tools: ToolCallParser | None = self.split.tools
        assert tools is not None, "calls come only from a tool-call parser"
        return out.ToolCallOut(id=call.call_id or tools.new_call_id(),
                               function=out.FunctionOut(name=call.name, arguments=call.arguments))

    @staticmethod
    def _finish(finish_reason: str, calls: int) -> str:
        """``tool_calls`` when the output had calls and ended as the model chose (not on a length)."""
        return "tool_calls" if calls and finish_reason == "stop" else finish_reason

    def _logprobs(self, logprobs: Sequence[TokenLogprobs]) -> out.ChatLogprobs | None:
        return self.logprobs.chat(logprobs) if self.logprobs is not None else None

    def usage_chunk(self, usage: Usage) -> out.ChatCompletionChunk:
        return out.ChatCompletionChunk(id=self.who.id, created=self.who.created, model=self.who.model, choices=[],
                                       usage=usage_body(usage))

    def whole(self, text: str, finish_reason: str, usage: Usage, logprobs: Sequence[TokenLogprobs] = (),
              prompt_logprobs: Sequence[TokenLogprobs] = ()) -> out.ChatCompletion:
        split = self.split.whole(text)
        calls = [self._call(call) for call in split.calls]
        message = out.ChatMessageOut(content=split.content or (None if calls else ""), tool_calls=calls,
                                     reasoning_content=split.reasoning or None,
                                     has_reasoning=self.split.reasoning is not None)
        choice = out.ChatChoice(index=self.index, message=message, finish_reason=self._finish(finish_reason,
                                                                                              len(calls)),
                                logprobs=self._logprobs(logprobs))
        prompt = self.prompt
        shown = prompt.names.vllm_prompt(prompt_logprobs, prompt.prompt_logprobs) \
            if prompt is not None and prompt.prompt_logprobs is not None else None
        return out.ChatCompletion(id=self.who.id, created=self.who.created, model=self.who.model, choices=[choice],
                                  usage=usage_body(usage), prompt_logprobs=shown)

"""The typed messages of one Generate call at the gateway, between its API fronts and ``RequestFlow``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from services.common.errors import ServiceError
from services.common.sampling_convert import SamplingFields
from services.engine.chat_template import DEFAULT_OPTIONS, PROMPT_CLOSED, PROMPT_OPENED, ChatTemplateOptions
from services.engine.logprobs import TokenLogprobs
from services.engine.sampling_params import SamplingParams
from services.engine.tokenizer import ChatMessage


@dataclass(frozen=True)
class GenerateInput:
    """A client's request, decoded from the proto. Exactly one of prompt / token_ids / messages is set
    (sequences: the gRPC front passes the proto's repeated fields uncopied)."""

    request_id: str = ""
    prompt: str | None = None
    token_ids: Sequence[int] | None = None
    messages: Sequence[ChatMessage] | None = None
    sampling: SamplingFields = field(default_factory=SamplingFields)
    truncate_prompt_tokens: int | None = None  # vLLM's: only the prompt's last that many tokens (-1: the context's)
    tools: Sequence[Mapping[str, Any]] = ()  # OpenAI tool definitions the chat template renders (messages only)
    template: ChatTemplateOptions = DEFAULT_OPTIONS  # how the chat template renders ``messages``
    # the reasoning markers (start, end) of the HTTP front's reasoning parser: with them ``prepare`` decides
    # whether the chat prompt's open turn already closed the reasoning or opened it (``PreparedRequest``)
    reasoning_markers: tuple[str, str] | None = None
    prompt_reasoning: str | None = None  # that verdict when known already (a prompt tokenized once for n choices)


@dataclass(frozen=True)
class PreparedRequest:
    """Validated and tokenized; sampling resolved (max_tokens and seed set)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    # how the chat prompt left the reasoning (``chat_template.prompt_reasoning``): "closed" (Qwen3's template with
    # enable_thinking false writes ``<think>\n\n</think>\n\n``: the output is all answer, and a constraint that
    # was to start after the end marker applies from the first token), "opened" (DeepSeek-R1's writes
    # ``<think>\n``: the output begins inside the reasoning), or ""
    prompt_reasoning: str = ""
    prompt_cut: bool = False  # truncate_prompt_tokens may have dropped some of it (it is that long)

    @property
    def reasoning_closed(self) -> bool:
        return self.prompt_reasoning == PROMPT_CLOSED

    @property
    def reasoning_opened(self) -> bool:
        return self.prompt_reasoning == PROMPT_OPENED


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class GenerateChunk:
    """One ``GenerateResponse``."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str = ""
    usage: Usage | None = None
    prefill_node: str = ""
    decode_node: str = ""
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token, when the request asks for logprobs
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # first chunk only, when asked: prompt tokens 1..
    stop_string: str | None = None  # the last chunk's, when a stop string ended the request: which one


class NodeCallError(ServiceError):
    """A node's call failed; carries the status code the client gets."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code

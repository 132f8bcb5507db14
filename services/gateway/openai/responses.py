"""Response bodies, as OpenAI shapes them (``openai`` package types parse them unchanged)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens served from a prefix cache


class UsageBody(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None  # None: not known yet (a continuous-usage chunk's)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pdserve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class CompletionLogprobs(BaseModel):
    """The legacy shape: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token (nothing predicts it)
    top_logprobs: list[dict[str, float] | None]  # the token itself and the k most likely
    text_offset: list[int]  # where each token's text starts in the completion's text (echo: the prompt's first)


class PromptLogprob(BaseModel):
    """vLLM's ``prompt_logprobs`` entry of one token."""

    logprob: float
    rank: int | None  # 1 = the most likely; None: not known
    decoded_token: str


class TopLogprobOut(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobOut]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    # vLLM's, when asked: per prompt token, {token id: entry} for it and the k most likely; None for the first
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class Completion(BaseModel):
    """``/v1/completions``: the whole response, or one streamed chunk (same object, partial text)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageBody | None = None


class FunctionOut(BaseModel):
    name: str
    arguments: str  # JSON text of an object


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionOut


class ToolCallDelta(ToolCallOut):
    """A streamed call: sent whole (name and all its arguments) once it closes; ``index`` counts the
    choice's calls from 0."""

    index: int


class ChatMessageOut(BaseModel):
    """``content`` is null when there are calls and no other text; ``tool_calls`` only when there are
    calls; ``reasoning_content`` (vLLM's extension) only when the server has a reasoning parser."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    has_reasoning: bool = Field(False, exclude=True)

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.tool_calls:
            data.pop("tool_calls", None)
        if not self.has_reasoning:
            data.pop("reasoning_content", None)
        return data


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageBody
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None  # vLLM's, of the rendered prompt


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None  # the first chunk only
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only what the chunk carries: the last one's delta is ``{}``."""
        data: dict[str, Any] = handler(self)
        return {name: value for name, value in data.items() if value is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageBody | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail

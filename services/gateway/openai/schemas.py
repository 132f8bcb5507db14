"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions`` (pydantic; a bad field is a 400 naming it).

What OpenAI defines and pdserve does not do is refused by name rather than silently ignored: ``n`` past 16,
``best_of`` > 1, ``echo`` and ``suffix`` here; the undeclared fields that would change the output
(``functions``, ``tools`` on completions, …) in ``unsupported.py``. Chat takes ``tools``, ``tool_choice``,
``parallel_tool_calls`` and messages' ``tool_calls``, ``tool_call_id`` and ``name`` (shapes in
``tool_schemas.py``; how they fit together is checked by ``tool_calling.py``), and vLLM's chat template
options ``add_generation_prompt``, ``continue_final_message`` and ``chat_template_kwargs``
(``services/engine/chat_template.py``). The output constraints
(``response_format``, ``guided_*``, ``structured_outputs``) are undeclared, read from the extra fields by
``structured.py``. Other fields (``user``, ``metadata``, …) are ignored. An explicit ``null`` means the
default. Extensions (as vLLM names them): ``top_k`` (-1 or 0 = off), ``min_p`` (0 = off),
``repetition_penalty`` (1 = off), ``stop_token_ids``, ``ignore_eos``, ``min_tokens``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from services.engine.chat_template import ChatTemplateOptions
from services.engine.logprobs import MAX_LOGPROBS
from services.engine.sampling_params import MAX_PENALTY, SEED_LIMIT
from services.gateway.openai.tool_schemas import NamedToolChoice, ToolBody, ToolCallBody

MAX_CHOICES = 16  # n: choices of one request (each runs as its own request on the nodes)
MAX_PROMPT_CHOICES = 64  # a batch of completions prompts: prompts × n (each runs as its own request)
TOOL_CHOICES = ("none", "auto", "required")


def _token_ids(value: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def default_of(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """``null`` for a field that has a default means that default (as OpenAI's API reads it); for a
    required field it stays ``null`` (and is refused)."""
    assert info.field_name is not None
    field = model.model_fields[info.field_name]
    return field.default if value is None and not field.is_required() else value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # undeclared fields: checked by unsupported.refuse_unsupported

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk carries the usage so far

    @field_validator("include_usage", "continuous_usage_stats", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        return default_of(cls, value, info)


class GenerationBody(BaseModel):
    """What both endpoints take: the model, sampling and streaming settings."""

    # undeclared fields: checked by unsupported.refuse_unsupported; NaN and infinities are not numbers here
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None  # None: the served model
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    repetition_penalty: float | None = Field(None, gt=0)
    min_p: float | None = Field(None, ge=0, le=1)
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None  # vLLM's: the only ids that may be sampled
    truncate_prompt_tokens: int | None = None  # vLLM's: only the prompt's last that many tokens (-1: the context's)
    include_stop_str_in_output: bool = False  # vLLM's: the stop string (or stop token) stays in the text
    skip_special_tokens: bool | None = None  # vLLM's: False = special tokens' text is in the output
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name each token "token_id:<id>", not its text
    bad_words: list[str] | None = None  # vLLM's: words the output may not contain

    @field_validator("*", mode="before")  # the endpoints' fields too
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        return default_of(cls, value, info)

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int) -> int:
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"must be in [1, {MAX_CHOICES}], got {n}")
        return n

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream", False):
            raise ValueError("only allowed when stream is true (as OpenAI and vLLM)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_as_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdecimal():  # what int() reads ("²" is a digit it does not); ids and biases: checked later
                raise ValueError(f"keys must be token ids, got {key!r}")
        return value

    @field_validator("allowed_token_ids")
    @classmethod
    def _some_allowed(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not value:
            raise ValueError("must not be empty (leave it out to allow every token)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        return [value] if isinstance(value, str) else value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``continuous_usage_stats``: only with ``include_usage``, as vLLM reads them."""
        return self.include_usage and self.stream_options is not None and self.stream_options.continuous_usage_stats


class CompletionBody(GenerationBody):
    """``POST /v1/completions``: ``prompt`` is a string, a list of token ids, or a batch: a list of either
    (read as the list of its prompts, one or more)."""

    prompt: list[str | list[int]] = Field(...)
    echo: bool = False  # the prompt's text first in the output; with logprobs, its tokens' logprobs first too
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and the k most likely
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompts(cls, value: Any) -> Any:
        expected = "expected a string, a list of token ids, or a list of either"
        if isinstance(value, str) or (isinstance(value, list) and value and _token_ids(value)):
            return [value]
        if not isinstance(value, list) or not value:
            raise ValueError(expected if not isinstance(value, list) else "must not be empty")
        for i, prompt in enumerate(value):
            if not isinstance(prompt, str) and not (isinstance(prompt, list) and _token_ids(prompt)):
                raise ValueError(f"[{i}]: {expected}")
        return value

    @field_validator("prompt")
    @classmethod
    def _batch_size(cls, prompts: list[str | list[int]], info: ValidationInfo) -> list[str | list[int]]:
        n = info.data.get("n", 1)
        if len(prompts) * n > MAX_PROMPT_CHOICES:
            raise ValueError(f"{len(prompts)} prompts × n = {n} is {len(prompts) * n} requests; at most "
                             f"{MAX_PROMPT_CHOICES} per call")
        return prompts

    @field_validator("logprobs", "prompt_logprobs")
    @classmethod
    def _logprobs_count(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise ValueError(f"must be in [0, {MAX_LOGPROBS}], got {value}")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError(f"only best_of=1 is supported, got {value}")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value


class ChatMessageBody(BaseModel):
    """One message; ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts (joined)."""

    model_config = ConfigDict(extra="ignore")  # other fields are ignored

    role: str
    content: str | list[dict[str, Any]] | None = Field(None, validate_default=True)  # absent: "" (tool calls)
    tool_calls: list[ToolCallBody] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool's: the call it answers
    name: str | None = None
    reasoning_content: str | None = None  # an assistant's earlier reasoning, sent back (the template may read it)

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: str | list[dict[str, Any]] | None) -> str:
        if value is None or isinstance(value, str):
            return value or ""
        texts = []
        for i, part in enumerate(value):
            if part.get("type") != "text":
                raise ValueError(f"part {i}: only text parts ({{'type': 'text', 'text': ...}}) are supported, "
                                 f"got type {part.get('type')!r}")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {i}: a text part's 'text' must be a string, got {part.get('text')!r}")
            texts.append(part["text"])
        return "".join(texts)

    @property
    def text(self) -> str:
        assert isinstance(self.content, str), "content is joined by the validator"
        return self.content


class ChatCompletionBody(GenerationBody):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` wins over ``max_tokens``."""

    messages: list[ChatMessageBody] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    # vLLM's: each prompt token's logprob and the k most likely (of the rendered prompt), not streamed (as vLLM)
    prompt_logprobs: int | None = None
    tools: list[ToolBody] | None = None
    tool_choice: str | NamedToolChoice | None = None  # None: "auto" with tools, "none" without
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None  # variables the chat template reads (enable_thinking, …)
    # OpenAI's values; given to the chat template as its variable reasoning_effort (GPT-OSS's "Reasoning: high";
    # Mistral Small 4's "none" or "high"; a template that reads no such variable renders the same prompt), unless
    # chat_template_kwargs sets it
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None

    @field_validator("add_generation_prompt", "continue_final_message", mode="before")
    @classmethod
    def _null_template_flag(cls, value: Any, info: ValidationInfo) -> Any:
        return default_of(cls, value, info)

    def template_options(self) -> ChatTemplateOptions:
        """The chat template's options of this request (checked when the prompt is rendered)."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        return ChatTemplateOptions(self.add_generation_prompt, self.continue_final_message, kwargs)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value is None or value in TOOL_CHOICES:
            return value
        if isinstance(value, dict):
            try:
                return NamedToolChoice.model_validate(value)
            except ValidationError as error:
                raise ValueError(f"expected {{'type': 'function', 'function': {{'name': ...}}}}: "
                                 f"{error.errors()[0]['msg']}") from None
        raise ValueError(f"expected one of {', '.join(TOOL_CHOICES)} or {{'type': 'function', 'function': "
                         f"{{'name': ...}}}}, got {value!r}"[:300])

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_count(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise ValueError(f"must be in [0, {MAX_LOGPROBS}], got {value}")
        if value is not None and info.data.get("stream"):
            raise ValueError("is not available with stream: true (as vLLM's chat completions)")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_count(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise ValueError(f"must be in [0, {MAX_LOGPROBS}], got {value}")
        if value and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return value

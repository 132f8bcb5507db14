"""The body of ``POST /v1/responses`` (pydantic; a bad field is a 400 naming it).

Declared: ``model``, ``input`` (a string, or a list of items: messages, ``function_call``,
``function_call_output``, ``reasoning``; read by ``to_chat.py``), ``instructions``, ``max_output_tokens``,
``temperature``, ``top_p``, ``tools`` (function tools), ``tool_choice``, ``parallel_tool_calls``, ``text``
(``format``: ``text``, ``json_object`` or ``json_schema``), ``reasoning`` (``effort``, given to the chat template
as ``reasoning_effort`` as on chat completions; ``summary`` ignored: the reasoning comes as its text),
``stream``, ``store`` (nothing is stored; the response says ``store: false``, as vLLM does without its store),
``include`` (``message.output_text.logprobs``, with ``top_logprobs`` alternatives; the other values OpenAI takes
are accepted and have nothing to add here), ``stream_options.include_obfuscation`` (nothing is obfuscated),
``metadata`` (echoed), ``user``.

Refused by name, since pdserve does not do them: ``previous_response_id``, ``conversation``, ``prompt``
(stored state), ``background: true``, ``truncation: auto``, ``max_tool_calls``, tools of another ``type``
than ``function``; the chat body's own spellings (``messages``, ``max_tokens``, ``response_format``, ``n``, …),
naming the Responses field to use. Undeclared fields go to
the chat request as they are (vLLM's sampling extensions: ``top_k``, ``min_p``, ``seed``, ``stop``, …, and
``chat_template_kwargs``), where they are read, ignored or refused as on chat completions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from services.engine.logprobs import MAX_LOGPROBS
from services.gateway.openai.schemas import default_of

OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
# what OpenAI's include takes; only the logprobs are given (reasoning.encrypted_content, which Codex asks for
# with store: false, has nothing to hold here: the reasoning comes back as its text; the others are outputs of
# tools this server does not run)
INCLUDABLE = frozenset({OUTPUT_TEXT_LOGPROBS, "reasoning.encrypted_content", "file_search_call.results",
                        "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
                        "computer_call_output.output.image_url", "code_interpreter_call.outputs"})


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None  # the reasoning is given as its text; no summary is written


class ResponsesBody(BaseModel):
    # undeclared fields go to the chat request (to_chat.py); NaN and infinities are not numbers here
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: ReasoningOptions | None = None
    stream: bool = False
    store: bool = True
    include: list[str] | None = None
    top_logprobs: int | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool = False
    truncation: Literal["disabled", "auto"] = "disabled"
    max_tool_calls: int | None = None
    stream_options: dict[str, Any] | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        return default_of(cls, value, info)

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, list) and not value:
            raise ValueError("must not be empty")
        return value

    @field_validator("include")
    @classmethod
    def _includable(cls, value: list[str] | None) -> list[str] | None:
        for i, name in enumerate(value or ()):
            if name not in INCLUDABLE:
                raise ValueError(f"[{i}]: expected one of {', '.join(sorted(INCLUDABLE))}, got {name!r}"[:400])
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_count(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise ValueError(f"must be in [0, {MAX_LOGPROBS}], got {value}")
        return value

    @field_validator("previous_response_id", "conversation", "prompt")
    @classmethod
    def _nothing_stored(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            raise ValueError(f"this server stores no responses or conversations, so {info.field_name} cannot be "
                             f"read; send the whole conversation in input")
        return value

    @field_validator("background")
    @classmethod
    def _foreground(cls, value: bool) -> bool:
        if value:
            raise ValueError("background responses are not supported (they need a store)")
        return value

    @field_validator("truncation")
    @classmethod
    def _no_truncation(cls, value: str) -> str:
        if value != "disabled":
            raise ValueError("only 'disabled' is supported: a conversation longer than the context is refused, "
                             "not cut")
        return value

    @field_validator("max_tool_calls")
    @classmethod
    def _no_call_limit(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("is not supported (parallel_tool_calls: false allows one call)")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for name in value or {}:  # include_obfuscation: nothing is obfuscated here, on or off
            if name != "include_obfuscation":
                raise ValueError(f"only include_obfuscation is taken, got {name!r}"[:300])
        return value

    @property
    def logprobs(self) -> bool:
        """The output text's logprobs are asked for (``include``; ``top_logprobs``: how many alternatives)."""
        return OUTPUT_TEXT_LOGPROBS in (self.include or ())

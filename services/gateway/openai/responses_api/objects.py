"""The Responses API's objects, as OpenAI shapes them (the ``openai`` package's ``Response`` and stream event
types parse them unchanged): the response, its output items, its usage."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from services.gateway.openai.responses import ChatTokenLogprob
from services.gateway.openai.responses_api.body import ResponsesBody

Status = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def item_id(prefix: str) -> str:
    """A fresh output item id, ``msg_…``, ``rs_…`` or ``fc_…`` as OpenAI prefixes them."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[ChatTokenLogprob] = Field(default_factory=list)  # when asked (include), else empty


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: item_id("msg"))
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "completed"
    content: list[OutputText] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """The model's reasoning as its text (no summary is written)."""

    type: Literal["reasoning"] = "reasoning"
    id: str = Field(default_factory=lambda: item_id("rs"))
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus = "completed"


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str = Field(default_factory=lambda: item_id("fc"))
    call_id: str
    name: str
    arguments: str  # JSON text of an object
    status: ItemStatus = "completed"


OutputItem = MessageItem | ReasoningItem | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens served from a prefix cache
    cache_write_tokens: int = 0  # OpenAI's billed cache writes: not counted here (always 0)


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponsesUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] | None = None  # None: the request ended otherwise (aborted)


class ResponseObject(BaseModel):
    """A response: whole, or a snapshot in a stream's events. The request's settings are echoed as OpenAI
    echoes them (``store`` is always false: nothing is stored)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status = "in_progress"
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    usage: ResponsesUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] | None = None
    store: bool = False
    background: bool = False
    previous_response_id: None = None
    truncation: Literal["disabled"] = "disabled"
    user: str | None = None

    @classmethod
    def of(cls, body: ResponsesBody, response_id: str, model: str) -> ResponseObject:
        """The response to ``body``, in progress and with no output yet."""
        text = {"format": {"type": "text"}, **(body.text or {})}
        return cls(id=response_id, created_at=int(time.time()), model=model, instructions=body.instructions,
                   max_output_tokens=body.max_output_tokens, metadata=body.metadata or {},
                   parallel_tool_calls=body.parallel_tool_calls, temperature=body.temperature, top_p=body.top_p,
                   top_logprobs=body.top_logprobs, tool_choice=body.tool_choice or "auto",
                   tools=body.tools or [], text=text,
                   reasoning=body.reasoning.model_dump() if body.reasoning is not None else None, user=body.user)

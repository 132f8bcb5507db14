"""A chat completions body as it runs, shared by the routes that run one (chat completions, and the Responses
and Messages APIs, which translate their bodies into one): its tools, its generation input, and how its
output splits into reasoning, answer and calls."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from services.gateway.generation import GenerateInput, PreparedRequest
from services.gateway.openai.output_split import OutputSplit
from services.gateway.openai.parsers import FrontParsers
from services.gateway.openai.reasoning.closed import ClosedReasoning
from services.gateway.openai.schemas import ChatCompletionBody
from services.gateway.openai.tool_calling import ToolRequest, tool_request_of
from services.gateway.openai.translate import chat_input


@dataclass(frozen=True)
class ChatRequest:
    tools: ToolRequest
    generate: GenerateInput
    split: OutputSplit
    answer_only: OutputSplit  # the split where the prompt already closed the reasoning

    @classmethod
    def of(cls, body: ChatCompletionBody, request_id: str, parsers: FrontParsers) -> ChatRequest:
        """Raises a 400 naming the param where the body's tools or messages cannot run."""
        tools = tool_request_of(body)
        generate = chat_input(body, request_id, parsers, tools)
        split = OutputSplit(parsers.reasoning, parsers.tools if tools.offered else None, tools.tools)
        answer_only = split if split.reasoning is None else dataclasses.replace(
            split, reasoning=ClosedReasoning.of(split.reasoning))
        return cls(tools, generate, split, answer_only)

    def split_for(self, prepared: PreparedRequest) -> OutputSplit:
        """How a choice's output splits: all of it is the answer where its prompt closed the reasoning."""
        return self.answer_only if prepared.reasoning_closed else self.split

    @property
    def constraint_param(self) -> str | None:
        """What a refused constraint of the request is named: ``tools`` for a forced call's grammar."""
        return "tools" if self.tools.forced else None

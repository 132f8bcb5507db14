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
from services.gateway.openai.reasoning.opened import OpenedReasoning
from services.gateway.openai.schemas import ChatCompletionBody
from services.gateway.openai.tool_calling import ToolRequest, tool_request_of
from services.gateway.openai.translate import chat_input


@dataclass(frozen=True)
class ChatRequest:
    tools: ToolRequest
    generate: GenerateInput
    split: OutputSplit
    answer_only: OutputSplit  # the split where the prompt already closed the reasoning
    opened: OutputSplit  # the split where the prompt opened it: the output begins inside the reasoning

    @classmethod
    def of(cls, body: ChatCompletionBody, request_id: str, parsers: FrontParsers) -> ChatRequest:
        """Raises a 400 naming the param where the body's tools or messages cannot run."""
        tools = tool_request_of(body)
        generate = chat_input(body, request_id, parsers, tools)
        split = OutputSplit(parsers.reasoning, parsers.tools if tools.offered else None, tools.tools)
        if split.reasoning is None:
            return cls(tools, generate, split, split, split)
        return cls(tools, generate, split, dataclasses.replace(split, reasoning=ClosedReasoning.of(split.reasoning)),
                   dataclasses.replace(split, reasoning=OpenedReasoning.of(split.reasoning)))

    def split_for(self, prepared: PreparedRequest) -> OutputSplit:
        """How a choice's output splits: all of it is the answer where its prompt closed the reasoning; it begins
        inside the reasoning where its prompt opened it."""
        if prepared.reasoning_closed:
            return self.answer_only
        return self.opened if prepared.reasoning_opened else self.split

    @property
    def constraint_param(self) -> str | None:
        """What a refused constraint of the request is named: ``tools`` for a forced call's grammar."""
        return "tools" if self.tools.forced else None

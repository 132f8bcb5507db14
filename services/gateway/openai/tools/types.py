"""The contract of tool calling at the HTTP front: what a tool is, what a parser reads out of the model's
output, and what every per-family parser (``hermes.py``, ``llama3_json.py``, ``mistral.py``, ``gpt_oss.py``,
``glm.py``, ``qwen3_coder.py``, ``deepseek.py``, ``kimi_k2.py``) provides.

A parser knows one family's format of tool calls in the output text. It reads a whole output
(:meth:`ToolCallParser.parse`) or a streamed one (:meth:`ToolCallParser.stream`), writes the Lark grammar
(llguidance's dialect, ``%json`` for the arguments) that forces a call when ``tool_choice`` is ``required``
or names a function, and — for chat templates with no tool section (the bundled SmolLM2's) — writes the
tools, an assistant's earlier calls and a tool's result as plain text in its own format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

NO_SPECIAL_TOKENS: Mapping[str, int] = MappingProxyType({})

EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    """One function of a request's ``tools``. ``parameters``: its arguments' JSON schema (an object)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(EMPTY_PARAMETERS))

    def openai_dict(self) -> dict[str, Any]:
        """As OpenAI sends it (and Hugging Face chat templates take it in ``tools``)."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ParsedToolCall:
    """A call found in the output: ``arguments`` is the JSON text of an object (OpenAI's shape); ``call_id``: the
    id the model wrote where its format carries one (Kimi K2's), else None (the front makes one)."""

    name: str
    arguments: str
    call_id: str | None = None


@dataclass(frozen=True)
class ParsedOutput:
    """An output split: the text outside tool calls (stripped; "" when there is none) and the calls, in order."""

    content: str
    calls: tuple[ParsedToolCall, ...] = ()


@dataclass(frozen=True)
class StreamPiece:
    """What a streaming parser releases: content text, or one complete call."""

    content: str = ""
    call: ParsedToolCall | None = None


class ToolStream(Protocol):
    """One streamed output: text in, pieces out, in order. Text that may begin a call is held back until it
    is known not to; a call is released whole once it closes (its name and all its arguments together)."""

    def feed(self, text: str) -> list[StreamPiece]:
        ...

    def finish(self) -> list[StreamPiece]:
        """The output ended: what is held back (an unfinished or unparseable call comes out as content; a
        call whose format needs no closing marker comes out as a call if it parses)."""
        ...


class ToolCallParser(Protocol):
    name: str  # as --tool-call-parser names it
    markers: tuple[str, ...]  # the format's marker texts: kept in the decoded output where they are special tokens
    # those of the markers that are special tokens of the front's tokenizer, with their ids (set by the front;
    # default none): a forced grammar writes them as those tokens (``grammar.with_special_tokens``)
    special_tokens: Mapping[str, int]

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        """Never raises: text with no well-formed call is all content. A call naming no tool of the request
        is still a call (the client decides); arguments that are not a JSON object make it content.
        ``tools``: the request's, for a format whose argument values are typed by their schema (GLM's)."""
        ...

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolStream:
        ...

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        """A Lark grammar (llguidance) whose every complete output ``parse`` reads as one call (``parallel``:
        one or more) of one of ``tools``, arguments valid against its ``parameters``, and no content."""
        ...

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        """A system-message block that describes ``tools`` and this format, for templates without a tool
        section."""
        ...

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        """An assistant's earlier calls as the model writes them (for templates without a tool section)."""
        ...

    def render_result(self, content: str, name: str | None) -> str:
        """A tool's result as a user-turn text (for templates without a tool section)."""
        ...

    def new_call_id(self) -> str:
        """A fresh id for a call the front returns (``call_`` + 24 hex; Mistral's templates need 9
        alphanumerics)."""
        ...

"""Llama 3.1+'s JSON tool calls: the output (after an optional ``<|python_tag|>``) is a call object, several
separated by ``;``::

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

(``arguments`` is read too). Only an output that starts with such a call (after whitespace) holds calls;
any other output is all content, and text after the last call is content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from services.gateway.openai.tools import grammar
from services.gateway.openai.tools.scan import (
    ContentEmitter,
    arguments_value,
    call_from_object,
    collect,
    decode_json,
    hex_call_id,
    skip_space,
)
from services.gateway.openai.tools.types import (
    NO_SPECIAL_TOKENS,
    ParsedOutput,
    ParsedToolCall,
    StreamPiece,
    ToolSpec,
)

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"
KEYS = ("parameters", "arguments")


def split_calls(text: str) -> tuple[list[ParsedToolCall], str]:
    """The calls ``text`` starts with and the text after them; no calls and all of ``text`` when it does
    not start with one."""
    pos = skip_space(text)
    if text.startswith(PYTHON_TAG, pos):
        pos += len(PYTHON_TAG)
    calls: list[ParsedToolCall] = []
    end = pos
    while True:
        found = decode_json(text, pos)
        call = call_from_object(found[0], KEYS) if found is not None else None
        if call is None:
            break
        calls.append(call)
        end = found[1]  # type: ignore[index]
        pos = skip_space(text, end)
        if not text.startswith(SEPARATOR, pos):
            break
        pos += len(SEPARATOR)
    return (calls, text[end:]) if calls else ([], text)


class Llama3JsonStream:
    """An output whose first non-space text is ``{`` or ``<|python_tag|>`` is held to the end and read then;
    any other streams as content (an end that may begin ``<|python_tag|>`` held until known)."""

    def __init__(self) -> None:
        self._content = ContentEmitter()
        self._pending = ""
        self._mode = "undecided"  # then "calls" (held to the end) or "content"

    def feed(self, text: str) -> list[StreamPiece]:
        if self._mode == "content":
            return self._content.emit(text)
        self._pending += text
        if self._mode == "undecided":
            start = self._pending.lstrip()
            if start.startswith("{") or start.startswith(PYTHON_TAG):
                self._mode = "calls"
            elif start and not PYTHON_TAG.startswith(start):
                self._mode = "content"
                return self._content.emit(self._take())
        return []

    def finish(self) -> list[StreamPiece]:
        calls, rest = split_calls(self._take())
        return [StreamPiece(call=call) for call in calls] + self._content.emit(rest)

    def _take(self) -> str:
        text, self._pending = self._pending, ""
        return text


class Llama3JsonParser:
    name = "llama3_json"
    markers = (PYTHON_TAG,)
    special_tokens: Mapping[str, int] = NO_SPECIAL_TOKENS

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> Llama3JsonStream:
        return Llama3JsonStream()

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        return grammar.forced_grammar(tools, "parameters", parallel, separator=SEPARATOR + " ")

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "You have access to the functions below. Each line describes one function as JSON (its name, "
            "what it does, and the JSON schema of its parameters):\n"
            f"{grammar.tool_lines(tools)}\n\n"
            "To call a function, answer with only a JSON object of the form "
            '{"name": "<function name>", "parameters": {<parameters as JSON>}} and nothing else. To call '
            'several, separate the objects with "; ". Do not call a function when none is needed; answer '
            "in plain text then."
        )

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return (SEPARATOR + " ").join(
            json.dumps({"name": call.name, "parameters": arguments_value(call.arguments)}, ensure_ascii=False)
            for call in calls)

    def render_result(self, content: str, name: str | None) -> str:
        label = f"the function {name}" if name else "the function call"
        return f"The result of {label}:\n{content}"

    def new_call_id(self) -> str:
        return hex_call_id()

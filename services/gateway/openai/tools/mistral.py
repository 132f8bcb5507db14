"""Mistral's tool calls: a ``[TOOL_CALLS]`` marker and a JSON list of call objects::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]

Text before the marker is content. Newer Mistral tokenizers (v11+) write ``[TOOL_CALLS]name[ARGS]{...}``,
one marker per call; that form is read too. A marker not followed by calls stays content, as does text
after the calls. The marker is a special token in Mistral's tokenizers: the output must be decoded with
special tokens kept for it to be seen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from services.gateway.openai.tools import grammar
from services.gateway.openai.tools.scan import (
    ContentEmitter,
    alnum_call_id,
    arguments_value,
    call_from_object,
    collect,
    decode_json,
    held_prefix_len,
    skip_space,
)
from services.gateway.openai.tools.types import (
    NO_SPECIAL_TOKENS,
    ParsedOutput,
    ParsedToolCall,
    StreamPiece,
    ToolSpec,
)

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"([^\s\[\]{}]+)" + re.escape(ARGS))


def _segment(text: str, pos: int) -> tuple[list[ParsedToolCall], int] | None:
    """The calls of the segment after a marker ending at ``pos`` and where they end; None if none parse."""
    pos = skip_space(text, pos)
    if text.startswith("[", pos):
        found = decode_json(text, pos)
        if found is None or not isinstance(found[0], list) or not found[0]:
            return None
        calls = [call_from_object(item) for item in found[0]]
        if any(call is None for call in calls):
            return None
        return calls, found[1]  # type: ignore[return-value]
    named = _NAME.match(text, pos)
    found = decode_json(text, named.end()) if named else None
    if named is None or found is None or not isinstance(found[0], dict):
        return None
    return [ParsedToolCall(named.group(1), json.dumps(found[0], ensure_ascii=False))], found[1]


def split_calls(text: str) -> tuple[list[ParsedToolCall], str]:
    """``text`` starts with the marker: the calls of its segments, and the text after the last one."""
    calls: list[ParsedToolCall] = []
    end = 0
    while text.startswith(MARKER, skip_space(text, end)):
        segment = _segment(text, skip_space(text, end) + len(MARKER))
        if segment is None:
            break
        calls += segment[0]
        end = segment[1]
    return calls, text[end:]


class MistralStream:
    """Content streams until ``[TOOL_CALLS]`` (an end that may begin it held until known); from the marker
    on, everything is held and read when the output ends."""

    def __init__(self) -> None:
        self._content = ContentEmitter()
        self._pending = ""
        self._calls = False

    def feed(self, text: str) -> list[StreamPiece]:
        self._pending += text
        if self._calls:
            return []
        start = self._pending.find(MARKER)
        if start >= 0:
            self._calls = True
            ready, self._pending = self._pending[:start], self._pending[start:]
            return self._content.emit(ready)
        cut = len(self._pending) - held_prefix_len(self._pending, MARKER)
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return self._content.emit(ready)

    def finish(self) -> list[StreamPiece]:
        text, self._pending = self._pending, ""
        calls, rest = split_calls(text) if self._calls else ([], text)
        return [StreamPiece(call=call) for call in calls] + self._content.emit(rest)


class MistralParser:
    name = "mistral"
    markers = (MARKER, ARGS)
    special_tokens: Mapping[str, int] = NO_SPECIAL_TOKENS

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> MistralStream:
        return MistralStream()

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        return grammar.forced_grammar(tools, "arguments", parallel, head=MARKER + "[", separator=", ", tail="]")

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "[AVAILABLE_TOOLS]\n"
            "You can call the functions below. Each line describes one function as JSON (its name, what it "
            "does, and the JSON schema of its arguments):\n"
            f"{grammar.tool_lines(tools)}\n[/AVAILABLE_TOOLS]\n\n"
            f"To call functions, answer with {MARKER} followed by a JSON list of calls, each an object with "
            "the function's name and its arguments:\n"
            f'{MARKER}[{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}]'
        )

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return MARKER + json.dumps(
            [{"name": call.name, "arguments": arguments_value(call.arguments)} for call in calls],
            ensure_ascii=False)

    def render_result(self, content: str, name: str | None) -> str:
        result = {"name": name, "content": content} if name else {"content": content}
        return "[TOOL_RESULTS]" + json.dumps(result, ensure_ascii=False) + "[/TOOL_RESULTS]"

    def new_call_id(self) -> str:
        return alnum_call_id(9)

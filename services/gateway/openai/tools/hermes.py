"""The Hermes format of tool calls (Qwen2.5, Qwen3, NousResearch Hermes templates)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several calls are several blocks. A block whose JSON is an object with a string ``name`` and an object
``arguments`` (or ``parameters``) is a call; any other block stays content, as does all text outside the
blocks. An unclosed last block is a call if what follows its opening marker parses as one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from services.gateway.openai.tools import grammar
from services.gateway.openai.tools.scan import (
    ContentEmitter,
    arguments_value,
    collect,
    held_prefix_len,
    hex_call_id,
    only_call,
)
from services.gateway.openai.tools.types import (
    NO_SPECIAL_TOKENS,
    ParsedOutput,
    ParsedToolCall,
    StreamPiece,
    ToolSpec,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
BlockCalls = ParsedToolCall | Sequence[ParsedToolCall] | None
"""What a block reads as: a call, several, or none (None, or empty: the block is content)."""


class HermesStream:
    """Content streams as it comes, except an end that may begin ``<tool_call>`` (held until known); a
    block is held from its opening marker and released whole at ``</tool_call>`` — as a call, or as content
    when its text is not one (by its ``read_call``). Another format's markers may stand for the two."""

    def __init__(self, read_call: Callable[[str], BlockCalls] = only_call, open_: str = OPEN,
                 close: str = CLOSE) -> None:
        """``read_call``: the call a block's text between its markers is (or its calls, where a block holds
        several: MiniMax's), or None (Hermes: one JSON call object; GLM's and Qwen3-Coder's formats reuse the
        stream with their own readers, DeepSeek's, Kimi's and MiniMax's with their own markers too)."""
        self._read_call = read_call
        self._open, self._close = open_, close
        self._content = ContentEmitter()
        self._pending = ""
        self._in_block = False
        self._searched = 0  # in a block: where the search for its closing marker goes on from

    def feed(self, text: str) -> list[StreamPiece]:
        self._pending += text
        pieces: list[StreamPiece] = []
        while True:
            open_, close = self._open, self._close
            if self._in_block:
                end = self._pending.find(close, max(len(open_), self._searched))
                if end < 0:
                    self._searched = max(len(open_), len(self._pending) - len(close) + 1)
                    return pieces
                block, self._pending = self._pending[:end + len(close)], self._pending[end + len(close):]
                self._in_block = False
                pieces += self._release(block, self._read_call(block[len(open_):end]))
                continue
            start = self._pending.find(open_)
            if start < 0:
                keep = held_prefix_len(self._pending, open_)
                ready, self._pending = self._pending[:len(self._pending) - keep], self._pending[
                    len(self._pending) - keep:]
                return pieces + self._content.emit(ready)
            pieces += self._content.emit(self._pending[:start])
            self._pending = self._pending[start:]
            self._in_block, self._searched = True, 0

    def finish(self) -> list[StreamPiece]:
        rest, self._pending = self._pending, ""
        call = self._read_call(rest[len(self._open):]) if self._in_block else None
        self._in_block = False
        return self._release(rest, call)

    def _release(self, block: str, found: BlockCalls) -> list[StreamPiece]:
        calls = [found] if isinstance(found, ParsedToolCall) else list(found or ())
        return [StreamPiece(call=call) for call in calls] if calls else self._content.emit(block)


class HermesParser:
    name = "hermes"
    markers = (OPEN, CLOSE)
    special_tokens: Mapping[str, int] = NO_SPECIAL_TOKENS

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> HermesStream:
        return HermesStream()

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        return grammar.forced_grammar(tools, "arguments", parallel, open_=OPEN + "\n", close="\n" + CLOSE,
                                      separator="\n")

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\n\n"
            "You may call one or more of the functions below to help with the user's request. Each line "
            "describes one function as JSON (its name, what it does, and the JSON schema of its "
            "arguments):\n"
            f"<tools>\n{grammar.tool_lines(tools)}\n</tools>\n\n"
            "To call a function, write a JSON object with its name and arguments between <tool_call> and "
            "</tool_call> tags, one block per call:\n"
            f'{OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n{CLOSE}\n'
            "The results come back in <tool_response> blocks."
        )

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return "\n".join(
            f"{OPEN}\n"
            + json.dumps({"name": call.name, "arguments": arguments_value(call.arguments)}, ensure_ascii=False)
            + f"\n{CLOSE}"
            for call in calls)

    def render_result(self, content: str, name: str | None) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def new_call_id(self) -> str:
        return hex_call_id()

"""What the formats whose calls sit in a section of special tokens share (DeepSeek-V3's and V3.1's ``deepseek.py``,
Kimi K2's ``kimi_k2.py``)::

    <section open><call open>…one call…<call close><call open>…<call close><section close>

Each call is a block, streamed as Hermes' blocks are (:class:`HermesStream` with the format's call markers) and read
by the format's :meth:`SectionedCallParser.read_call`; the section's own markers are dropped wherever they stand;
any other text is content. Arguments are JSON objects. A forced call is the section around the format's calls with
``%json`` arguments of each tool; its markers are the tokenizer's special tokens where they are
(``grammar.with_special_tokens``), which the parser reads the same as text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from services.engine.structured.schema_tools import close_objects
from services.gateway.openai.tools import grammar
from services.gateway.openai.tools.grammar import lark_literal
from services.gateway.openai.tools.hermes import HermesStream
from services.gateway.openai.tools.scan import (
    arguments_value,
    collect,
    decode_json,
    held_prefix_len,
    hex_call_id,
    skip_space,
)
from services.gateway.openai.tools.schema_values import json_value_grammar
from services.gateway.openai.tools.types import (
    NO_SPECIAL_TOKENS,
    ParsedOutput,
    ParsedToolCall,
    StreamPiece,
    ToolSpec,
)


class DroppedMarkers:
    """Streamed text with ``markers`` taken out: an end that may begin one is held until known."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self._markers, self._pending = markers, ""

    def take(self, text: str) -> str:
        pending = self._pending + text
        for marker in self._markers:
            pending = pending.replace(marker, "")
        keep = max(held_prefix_len(pending, marker) for marker in self._markers)
        ready, self._pending = pending[:len(pending) - keep], pending[len(pending) - keep:]
        return ready

    def rest(self) -> str:
        rest, self._pending = self._pending, ""
        return rest


class SectionedStream:
    """A :class:`HermesStream` of the call blocks, fed text without the section markers."""

    def __init__(self, blocks: HermesStream, section_markers: tuple[str, ...]) -> None:
        self._blocks, self._dropped = blocks, DroppedMarkers(section_markers)

    def feed(self, text: str) -> list[StreamPiece]:
        return self._blocks.feed(self._dropped.take(text))

    def finish(self) -> list[StreamPiece]:
        return self._blocks.feed(self._dropped.rest()) + self._blocks.finish()


def json_arguments(text: str, pos: int = 0) -> str | None:
    """The compact JSON text of the object at ``text[pos:]`` when whitespace alone follows it, else None."""
    found = decode_json(text, pos)
    if found is None or not isinstance(found[0], dict) or skip_space(text, found[1]) != len(text):
        return None
    return json.dumps(found[0], ensure_ascii=False)


class SectionedCallParser:
    """A format provides its markers, :meth:`read_call`, :meth:`write_call` and :meth:`call_grammar`."""

    name: str
    section_open: str
    section_close: str
    call_open: str
    call_close: str
    extra_markers: tuple[str, ...] = ()  # the format's other special tokens (a separator)
    special_tokens: Mapping[str, int] = NO_SPECIAL_TOKENS

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.section_open, self.section_close, self.call_open, self.call_close, *self.extra_markers)

    def read_call(self, body: str) -> ParsedToolCall | None:
        """The call a block's text between its call markers is, or None."""
        raise NotImplementedError

    def write_call(self, call: ParsedToolCall, index: int) -> str:
        """The text between the call markers of ``call``, the ``index``-th of its turn."""
        raise NotImplementedError

    def call_grammar(self, tool: ToolSpec, arguments: str) -> str:
        """The Lark sequence between the call markers of a call of ``tool`` (``arguments``: its JSON's rule)."""
        raise NotImplementedError

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> SectionedStream:
        return SectionedStream(HermesStream(self.read_call, self.call_open, self.call_close),
                               (self.section_open, self.section_close))

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        if not tools:
            raise ValueError("a forced tool call needs at least one tool")
        calls = "call+" if parallel else "call"
        lines = [f"start: {lark_literal(self.section_open)} {calls} {lark_literal(self.section_close)}",
                 f"call: {lark_literal(self.call_open)} ("
                 + " | ".join(f"tool_{i}" for i in range(len(tools))) + f") {lark_literal(self.call_close)}"]
        for i, tool in enumerate(tools):
            arguments = json_value_grammar(close_objects(dict(tool.parameters)), {}, grammar.JSON_STYLE)
            lines += [f"tool_{i}: {self.call_grammar(tool, f'arguments_{i}')}", f"arguments_{i}: {arguments}"]
        return "\n".join(lines) + "\n"

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        example = self.render_calls([ParsedToolCall("<function name>", "{<arguments as JSON>}")])
        return ("# Tools\n\nYou may call the functions below. Each line describes one function as JSON (its name, "
                f"what it does, and the JSON schema of its arguments):\n{grammar.tool_lines(tools)}\n\n"
                f"To call functions, write them as:\n{example}\n(one call block per call, inside one section).")

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        blocks = "".join(f"{self.call_open}{self.write_call(call, i)}{self.call_close}" for i, call in enumerate(calls))
        return f"{self.section_open}{blocks}{self.section_close}"

    def render_result(self, content: str, name: str | None) -> str:
        return f"Result of {name or 'the call'}:\n{content}"

    def new_call_id(self) -> str:
        return hex_call_id()


def arguments_text(call: ParsedToolCall) -> str:
    """A call's arguments as compact JSON (its text as given when it is not JSON)."""
    value = arguments_value(call.arguments)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

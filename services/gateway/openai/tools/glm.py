"""GLM's tool calls (GLM-4.5, 4.5-Air and 4.6: ``glm45``; GLM-4.7: ``glm47``), key/value pairs in tags::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

GLM-4.7 writes the same without the newlines; either is read by both. A value is written as GLM's chat templates
write it: a string as it is, anything else as JSON. Reading it back takes the tool's schema, as vLLM's GLM parsers
do: an argument whose schema is a string keeps its text (``"123"`` stays a string), any other is read as JSON, or
kept as text where it is not JSON (also an argument the request's tools do not describe, or describe through a
``$ref`` or ``anyOf``; ``NaN`` and ``Infinity`` stay text, and a nullable string's ``null`` is null). A block that
is not a function name (letters, digits, ``_ . : -``) followed by key/value pairs stays content; an unclosed last
block is a call if it is one so far.

The forced grammar (``tool_choice`` required or named) writes each tool's properties in its schema's order, the
required ones always: a string value any text up to the first ``</arg_value>`` (within its ``minLength`` and
``maxLength``; its ``pattern`` and ``format`` are not held), an ``enum`` or ``const`` of strings one of them, any
other value ``%json`` of its schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from services.gateway.openai.tools.grammar import JSON_STYLE, lark_literal, tool_lines
from services.gateway.openai.tools.hermes import CLOSE, OPEN
from services.gateway.openai.tools.scan import arguments_value
from services.gateway.openai.tools.schema_values import (
    FUNCTION_NAME,
    is_nullable,
    is_string_schema,
    json_value,
    json_value_grammar,
    property_schema,
)
from services.gateway.openai.tools.tagged import TaggedCallParser
from services.gateway.openai.tools.types import ParsedToolCall, ToolSpec

KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
# a value ends at a closing tag followed by the next pair or the end (one inside a JSON string is the value's)
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>(?=\s*(?:<arg_key>|\Z))",
                   re.DOTALL)
_CLOSE = r"<\/arg_value>"
_KEY = r"/[^<\n]+/"


def _value(text: str, schema: Any) -> Any:
    if is_string_schema(schema):
        return None if is_nullable(schema) and text == "null" else text  # the template writes None as null
    return json_value(text)


def read_call(body: str, tools: Sequence[ToolSpec] = ()) -> ParsedToolCall | None:
    """The call a block's text between ``<tool_call>`` and ``</tool_call>`` is, or None."""
    first = body.find(KEY_OPEN)
    name = (body if first < 0 else body[:first]).strip()
    if FUNCTION_NAME.fullmatch(name) is None:
        return None
    arguments: dict[str, Any] = {}
    pos = len(body) if first < 0 else first
    while body[pos:].strip():
        pair = _PAIR.match(body, pos)
        if pair is None:
            return None
        key = pair.group(1).strip()
        arguments[key] = _value(pair.group(2), property_schema(tools, name, key))
        pos = pair.end()
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


class GlmParser(TaggedCallParser):
    markers = (OPEN, CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE)
    text_rule = "arg_text"
    value_close, value_close_regex = VALUE_CLOSE, _CLOSE

    def __init__(self, name: str = "glm45", newlines: bool = True) -> None:
        self.name = name
        self._nl = "\n" if newlines else ""  # GLM-4.5's templates put a newline after the name and each tag pair
        self.call_open, self.separator = OPEN, self._nl

    def read_call(self, body: str, tools: Sequence[ToolSpec]) -> ParsedToolCall | None:
        return read_call(body, tools)

    def function_rule(self, tool: ToolSpec, arguments: list[str]) -> str:
        return " ".join([lark_literal(tool.name + self._nl), *arguments])

    def argument_rule(self, key: str, value: str) -> str:
        head = lark_literal(f"{KEY_OPEN}{key}{KEY_CLOSE}{self._nl}{VALUE_OPEN}")
        return f"{head} {value}" + (f" {lark_literal(self._nl)}" if self._nl else "")

    def free_arguments(self) -> str:
        key = f"{lark_literal(KEY_OPEN)} {_KEY} {lark_literal(KEY_CLOSE + self._nl + VALUE_OPEN)}"
        return f"({key} {self.text_rule}" + (f" {lark_literal(self._nl)})*" if self._nl else ")*")

    def typed_value(self, schema: Any, defs: Mapping[str, Any]) -> str:
        return json_value_grammar(schema, defs, JSON_STYLE)

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\n\n"
            "You may call one or more of the functions below to help with the user's request. Each line "
            "describes one function as JSON (its name, what it does, and the JSON schema of its arguments):\n"
            f"<tools>\n{tool_lines(tools)}\n</tools>\n\n"
            "To call a function, write its name and each argument in this format, one block per call (a string "
            "value as it is, any other value as JSON):\n"
            f"{OPEN}<function name>{self._nl}{KEY_OPEN}<argument name>{KEY_CLOSE}{self._nl}{VALUE_OPEN}"
            f"<argument value>{VALUE_CLOSE}{self._nl}{CLOSE}\n"
            "The results come back in <tool_response> blocks."
        )

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return self._nl.join(self._render(call) for call in calls)

    def _render(self, call: ParsedToolCall) -> str:
        arguments = arguments_value(call.arguments)
        pairs = arguments.items() if isinstance(arguments, dict) else ()
        body = "".join(f"{KEY_OPEN}{key}{KEY_CLOSE}{self._nl}{VALUE_OPEN}"
                       f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
                       f"{VALUE_CLOSE}{self._nl}" for key, value in pairs)
        return f"{OPEN}{call.name}{self._nl}{body}{CLOSE}"

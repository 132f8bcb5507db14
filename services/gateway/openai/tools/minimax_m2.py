"""MiniMax-M2's tool calls (``minimax_m2``, vLLM's name; M2, M2.1, M2.5): one block of one or more invocations::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

A value is read as MiniMax's own parser reads it (its tool-calling guide), by the tool's schema: ``null`` (any
case) is null; a string keeps its text (stripped); an integer or number is read as one (a number with no fraction
as an integer) else its text stays; a boolean is true for ``true`` or ``1`` (any case), false otherwise; anything
else is read as JSON where it is JSON, else its text stays; an argument the request's tools do not describe is a
string. A name may be quoted. A value ends at its first ``</parameter>`` (one holding ``</invoke>`` is still the
value's). A block that is not invocations of parameters stays content.

The forced grammar writes each tool's parameters in its schema's order (the required ones always): a string any
text up to the first ``</parameter>`` (within its length bounds), an ``enum``/``const`` of strings one of them, a
boolean ``true``/``false``, anything else ``%json`` of its schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from services.gateway.openai.tools.grammar import JSON_STYLE, lark_literal, tool_lines
from services.gateway.openai.tools.scan import arguments_value
from services.gateway.openai.tools.schema_values import (
    FUNCTION_NAME,
    is_string_schema,
    json_value,
    json_value_grammar,
    property_schema,
    schema_type,
)
from services.gateway.openai.tools.tagged import TaggedCallParser
from services.gateway.openai.tools.types import ParsedToolCall, ToolSpec

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
_NAME = r"(\"[^\"]*\"|'[^']*'|[^>]*)"
_INVOKE = re.compile(r"\s*<invoke name=" + _NAME + r">")
_INVOKE_END = re.compile(r"\s*</invoke>")
_PARAMETER = re.compile(r"\s*<parameter name=" + _NAME + r">(.*?)</parameter>", re.DOTALL)


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'" else name


def _value(text: str, schema: Any) -> Any:
    if text.lower() == "null":
        return None
    if schema is None or is_string_schema(schema):
        return text
    kind = schema_type(schema)
    if kind == "boolean":
        return text.lower() in ("true", "1")
    value = json_value(text)
    if kind == "integer":
        return value if isinstance(value, int) and not isinstance(value, bool) else text
    if kind == "number":
        if not isinstance(value, int | float) or isinstance(value, bool):
            return text
        return int(value) if float(value).is_integer() else value
    return value


def read_calls(body: str, tools: Sequence[ToolSpec] = ()) -> list[ParsedToolCall] | None:
    """The calls a block's text between ``<minimax:tool_call>`` and ``</minimax:tool_call>`` is, or None."""
    calls, pos = [], 0
    while body[pos:].strip():
        invoke = _INVOKE.match(body, pos)
        if invoke is None or FUNCTION_NAME.fullmatch(name := _unquote(invoke.group(1))) is None:
            return None
        pos, arguments = invoke.end(), {}
        while (end := _INVOKE_END.match(body, pos)) is None:  # a value holding "</invoke>" is the value's
            parameter = _PARAMETER.match(body, pos)
            if parameter is None:
                return None
            key = _unquote(parameter.group(1))
            arguments[key] = _value(parameter.group(2).strip(), property_schema(tools, name, key))
            pos = parameter.end()
        calls.append(ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False)))
        pos = end.end()
    return calls or None


class MiniMaxM2Parser(TaggedCallParser):
    name = "minimax_m2"
    markers = (OPEN, CLOSE)
    block_open, block_close = OPEN, CLOSE
    calls_in_block = True
    call_open = OPEN + "\n"
    text_rule = "parameter_text"
    value_close, value_close_regex = "</parameter>", r"<\/parameter>"

    def read_call(self, body: str, tools: Sequence[ToolSpec]) -> list[ParsedToolCall] | None:
        return read_calls(body, tools)

    def function_rule(self, tool: ToolSpec, arguments: list[str]) -> str:
        return " ".join([lark_literal(f'<invoke name="{tool.name}">\n'), *arguments, lark_literal("</invoke>\n")])

    def argument_rule(self, key: str, value: str) -> str:
        opening = '<parameter name="' + key + '">'
        return f"{lark_literal(opening)} {value} {lark_literal(chr(10))}"

    def free_arguments(self) -> str:
        return f'("<parameter name=\\"" /[^"\\n]+/ "\\">" {self.text_rule} "\\n")*'

    def typed_value(self, schema: Any, defs: Mapping[str, Any]) -> str:
        if schema_type(schema) == "boolean":
            return '("true" | "false")'
        return f"({json_value_grammar(schema, defs, JSON_STYLE)})"

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\nYou may call one or more tools to assist with the user query.\nHere are the tools available "
            f"in JSONSchema format:\n\n<tools>\n{tool_lines(tools)}\n</tools>\n\n"
            "When making tool calls, use XML format to invoke tools and pass parameters:\n\n"
            f'{OPEN}\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1</parameter>\n'
            f"...\n</invoke>\n{CLOSE}"
        )

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return f"{OPEN}\n" + "".join(_render(call) for call in calls) + CLOSE

    def render_result(self, content: str, name: str | None) -> str:
        return f"<response>{content}</response>"


def _render(call: ParsedToolCall) -> str:
    """An invocation as MiniMax's template writes it (a string bare, anything else as JSON)."""
    arguments = arguments_value(call.arguments)
    pairs = arguments.items() if isinstance(arguments, dict) else ()
    body = "".join(f'<parameter name="{key}">'
                   f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}</parameter>\n"
                   for key, value in pairs)
    return f'<invoke name="{call.name}">\n{body}</invoke>\n'

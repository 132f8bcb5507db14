"""Qwen3-Coder's tool calls (``qwen3_coder``, vLLM's name; Qwen3-Coder-30B-A3B and 480B-A35B, whose template
writes them so), one tag per function and per parameter::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

The template writes an object or a list as JSON and anything else as Python's ``str`` of it (``True``, ``None``,
``2.5``), each value on its own lines: one line break after ``<parameter=…>`` and one before ``</parameter>`` are
the format's, not the value's. Reading it back takes the tool's schema, as vLLM's parser does: a string keeps its
text; an integer or number is read as one (else its text stays); a boolean is ``true`` or ``false`` in either case
(else its text stays); ``null`` or ``None`` is null (for a string only where its schema allows null); an object, a
list, or any other type is read as JSON where it is JSON (else its text stays); an argument the request's tools do
not describe keeps its text. A block that is not one ``<function=NAME>`` of parameters (its ``</function>`` may be
missing at the end) stays content.

The forced grammar writes each tool's parameters in its schema's order, the required ones always: a string any
text up to the first ``\\n</parameter>`` (within its ``minLength`` and ``maxLength``), an ``enum`` or ``const``
of strings one of them, a boolean ``True``/``False`` (as the template writes it; ``true``/``false`` too; ``None``
and ``null`` where it allows null), any other value ``%json`` of its schema (and ``None`` where it allows null). A
string never holds ``</tool_call>``; a JSON string could (the call would then read as content).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from services.engine.structured.schema_tools import close_objects
from services.gateway.openai.tools.grammar import JSON_STYLE, lark_literal, tool_lines
from services.gateway.openai.tools.hermes import CLOSE, OPEN, HermesStream
from services.gateway.openai.tools.scan import arguments_value, collect, hex_call_id
from services.gateway.openai.tools.schema_values import (
    FUNCTION_NAME,
    is_nullable,
    is_string_schema,
    json_value,
    json_value_grammar,
    lazy_text,
    property_schema,
    schema_type,
    string_options,
)
from services.gateway.openai.tools.types import ParsedOutput, ParsedToolCall, ToolSpec

# the function's closing tag may be missing at the block's end (vLLM reads such a call too)
_FUNCTION = re.compile(r"\s*<function=([^>\n]*)>(.*?)(?:</function>)?\s*", re.DOTALL)
# a value ends at a closing tag followed by the next parameter or the end: one inside a value (a string's
# "a</parameter>b", a JSON string's) is the value's
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>(?=\s*(?:<parameter=|\Z))", re.DOTALL)
_CLOSE = r"\n<\/parameter>"
_BOOLEANS = {"true": True, "false": False}
_NULLS = ("null", "None")


def _value(text: str, schema: Any) -> Any:
    if schema is None or is_string_schema(schema):
        return None if is_nullable(schema) and text in _NULLS else text
    if text in _NULLS:
        return None
    kind = schema_type(schema)
    if kind == "boolean":
        return _BOOLEANS.get(text.lower(), text)
    value = json_value(text)
    if kind in ("integer", "number"):
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        return value if numeric and (kind == "number" or isinstance(value, int)) else text
    return value


def _unwrap(text: str) -> str:
    """The value between the format's line breaks (one after the opening tag, one before the closing one)."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


def read_call(body: str, tools: Sequence[ToolSpec] = ()) -> ParsedToolCall | None:
    """The call a block's text between ``<tool_call>`` and ``</tool_call>`` is, or None."""
    function = _FUNCTION.fullmatch(body)
    if function is None or FUNCTION_NAME.fullmatch(name := function.group(1).strip()) is None:
        return None
    inner, pos, arguments = function.group(2), 0, {}
    while inner[pos:].strip():
        parameter = _PARAMETER.match(inner, pos)
        if parameter is None:
            return None
        key = parameter.group(1).strip()
        arguments[key] = _value(_unwrap(parameter.group(2)), property_schema(tools, name, key))
        pos = parameter.end()
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


class Qwen3CoderParser:
    name = "qwen3_coder"
    markers = (OPEN, CLOSE)

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> HermesStream:
        return HermesStream(lambda body: read_call(body, tools))

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        if not tools:
            raise ValueError("a forced tool call needs at least one tool")
        lines = ["start: call" + (' ("\\n" call)*' if parallel else ""),
                 f"call: {lark_literal(OPEN + chr(10))} ({' | '.join(f'tool_{i}' for i in range(len(tools)))}) "
                 f"{lark_literal(CLOSE)}",
                 *lazy_text("parameter_text", _CLOSE)]
        for i, tool in enumerate(tools):
            lines += _tool_rules(f"tool_{i}", tool)
        return "\n".join(lines) + "\n"

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\n\n"
            "You may call one or more of the functions below to help with the user's request. Each line "
            "describes one function as JSON (its name, what it does, and the JSON schema of its arguments):\n"
            f"<tools>\n{tool_lines(tools)}\n</tools>\n\n"
            "To call a function, write it in this format, one block per call (an object or a list as JSON):\n"
            f"{OPEN}\n<function=<function name>>\n<parameter=<parameter name>>\n<value>\n</parameter>\n"
            f"</function>\n{CLOSE}\n"
            "The results come back in <tool_response> blocks."
        )

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return "\n".join(_render(call) for call in calls)

    def render_result(self, content: str, name: str | None) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def new_call_id(self) -> str:
        return hex_call_id()


def _render(call: ParsedToolCall) -> str:
    """As Qwen3-Coder's template writes a call (an object or a list as JSON, anything else as ``str``)."""
    arguments = arguments_value(call.arguments)
    pairs = arguments.items() if isinstance(arguments, dict) else ()
    body = "".join(f"<parameter={key}>\n"
                   f"{json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value}\n"
                   "</parameter>\n" for key, value in pairs)
    return f"{OPEN}\n<function={call.name}>\n{body}</function>\n{CLOSE}"


def _tool_rules(rule: str, tool: ToolSpec) -> list[str]:
    parameters = close_objects(dict(tool.parameters))
    defs = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
    head, tail = lark_literal(f"<function={tool.name}>\n"), lark_literal("</function>\n")
    properties = parameters.get("properties")
    if not isinstance(properties, Mapping):  # free-form arguments: any names, values as text
        return [f'{rule}: {head} ("<parameter=" /[^>\\n]+/ ">\\n" parameter_text "\\n")* {tail}']
    required = set(parameters.get("required") or ())
    parts, rules = [], []
    for j, (key, schema) in enumerate(properties.items()):
        value, lines = _value_rule(schema, defs, f"{rule}_{j}_text")
        rules += [f"{rule}_{j}: {lark_literal(f'<parameter={key}>' + chr(10))} {value} {lark_literal(chr(10))}",
                  *lines]
        parts.append(f"{rule}_{j}" + ("" if key in required else "?"))
    return [f"{rule}: {' '.join([head, *parts, tail])}", *rules]


def _value_rule(schema: Any, defs: Mapping[str, Any], rule: str) -> tuple[str, list[str]]:
    """One parameter's value and its closing tag, and the lines it needs (``rule``: its own rule's name)."""
    close = lark_literal("\n</parameter>")
    if isinstance(schema, Mapping) and is_string_schema(schema):
        if strings := string_options(schema):
            return "(" + " | ".join(lark_literal(s) for s in strings) + f") {close}", []
        if schema.get("minLength") or schema.get("maxLength") is not None:
            return rule, lazy_text(rule, _CLOSE, schema)
        return "parameter_text", []
    none = ' | "None"' if is_nullable(schema) else ""  # the template's str(None); JSON's null is in the %json
    if schema_type(schema) == "boolean":
        nulls = f'{none} | "null"' if none else ""
        return f'("True" | "False" | "true" | "false"{nulls}) {close}', []
    return f"({json_value_grammar(schema, defs, JSON_STYLE)}{none}) {close}", []

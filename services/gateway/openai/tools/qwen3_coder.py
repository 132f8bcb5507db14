"""Qwen3-Coder's tool calls (``qwen3_coder``, vLLM's name; Qwen3-Coder-30B-A3B and 480B-A35B, whose template
writes them so), one tag per function and per parameter (Seed-OSS's, :class:`SeedOssParser`, in their own block)::

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
    schema_type,
)
from services.gateway.openai.tools.tagged import TaggedCallParser
from services.gateway.openai.tools.types import ParsedToolCall, ToolSpec

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


class Qwen3CoderParser(TaggedCallParser):
    name = "qwen3_coder"
    call_open = OPEN + "\n"
    text_rule = "parameter_text"
    value_close, value_close_regex = "\n</parameter>", _CLOSE

    def read_call(self, body: str, tools: Sequence[ToolSpec]) -> ParsedToolCall | None:
        return read_call(body, tools)

    def function_rule(self, tool: ToolSpec, arguments: list[str]) -> str:
        return " ".join([lark_literal(f"<function={tool.name}>\n"), *arguments, lark_literal("</function>\n")])

    def argument_rule(self, key: str, value: str) -> str:
        return f"{lark_literal(f'<parameter={key}>' + chr(10))} {value} {lark_literal(chr(10))}"

    def free_arguments(self) -> str:
        return f'("<parameter=" /[^>\\n]+/ ">\\n" {self.text_rule} "\\n")*'

    def typed_value(self, schema: Any, defs: Mapping[str, Any]) -> str:
        none = ' | "None"' if is_nullable(schema) else ""  # the template's str(None); JSON's null is in the %json
        if schema_type(schema) == "boolean":
            nulls = f'{none} | "null"' if none else ""
            return f'("True" | "False" | "true" | "false"{nulls})'
        return f"({json_value_grammar(schema, defs, JSON_STYLE)}{none})"

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


def _render(call: ParsedToolCall, open_: str = OPEN, close: str = CLOSE, wrap: str = "\n") -> str:
    """As Qwen3-Coder's template writes a call (an object or a list as JSON, anything else as ``str``; ``wrap``: the
    line break around each value, none in Seed-OSS's)."""
    arguments = arguments_value(call.arguments)
    pairs = arguments.items() if isinstance(arguments, dict) else ()
    body = "".join(f"<parameter={key}>{wrap}"
                   f"{json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value}{wrap}"
                   "</parameter>\n" for key, value in pairs)
    return f"{open_}\n<function={call.name}>\n{body}</function>\n{close}"


SEED_OPEN, SEED_CLOSE = "<seed:tool_call>", "</seed:tool_call>"


class SeedOssParser(Qwen3CoderParser):
    """Seed-OSS's tool calls (``seed_oss``, vLLM's name): Qwen3-Coder's tags in a ``<seed:tool_call>`` block, each
    value written without the line breaks around it (``<parameter=city>Paris</parameter>``); read as
    Qwen3-Coder's (a line break after the opening or before the closing tag is dropped either way)."""

    name = "seed_oss"
    markers = (SEED_OPEN, SEED_CLOSE)
    block_open, block_close = SEED_OPEN, SEED_CLOSE
    call_open = SEED_OPEN + "\n"
    value_close, value_close_regex = "</parameter>", r"<\/parameter>"

    def argument_rule(self, key: str, value: str) -> str:
        return f"{lark_literal(f'<parameter={key}>')} {value} {lark_literal(chr(10))}"

    def free_arguments(self) -> str:
        return f'("<parameter=" /[^>\\n]+/ ">" {self.text_rule} "\\n")*'

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\n\nYou may call one or more of the functions below. Each line describes one function as JSON "
            f"(its name, what it does, and the JSON schema of its arguments):\n{tool_lines(tools)}\n\n"
            "To call a function, write it in this format, one block per call (an object or a list as JSON):\n"
            f"{SEED_OPEN}\n<function=<function name>>\n<parameter=<parameter name>><value></parameter>\n"
            f"</function>\n{SEED_CLOSE}"
        )

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return "\n".join(_render(call, SEED_OPEN, SEED_CLOSE, "") for call in calls)

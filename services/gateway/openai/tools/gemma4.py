"""Gemma 4's tool calls (``gemma4``, vLLM's name; Gemma 4 E2B, E4B, 26B-A4B and 31B, whose template writes them so):
one block per call, blocks written one after another with nothing between them::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|><|tool_call>call:get_time{}<tool_call|>

The arguments are Gemma 4's values (:mod:`~services.gateway.openai.tools.gemma4_values`), not JSON. A block that is
not ``call:NAME{…}`` stays content. The model ends its turn after its calls with ``<|tool_response>``, one of its EOS
ids (the template then writes each result as ``<|tool_response>response:NAME{…}<tool_response|>``).

The forced grammar writes each tool's arguments in sorted order of their names (as the template's ``dictsort``: case
aside), the
required ones always, a comma between two: a string as ``<|"|>`` text ``<|"|>`` (within its ``minLength`` and
``maxLength``; an ``enum`` or ``const`` of strings one of them), an object with ``properties`` the same way within
braces, a list of its ``items`` within brackets (``minItems`` to ``maxItems`` of them), a number, an integer or a
boolean as ``%json`` of its schema (which JSON and Gemma 4 write alike), null as ``None``; any other value in Gemma
4's syntax, unchecked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from services.engine.structured.schema_tools import close_objects
from services.gateway.openai.tools.gemma4_values import QUOTE, read_arguments, render_value, sort_keys
from services.gateway.openai.tools.grammar import JSON_STYLE, lark_literal
from services.gateway.openai.tools.hermes import HermesStream
from services.gateway.openai.tools.scan import arguments_value, collect, hex_call_id
from services.gateway.openai.tools.schema_values import FUNCTION_NAME, json_value_grammar, lazy_text, text_before_token
from services.gateway.openai.tools.types import NO_SPECIAL_TOKENS, ParsedOutput, ParsedToolCall, ToolSpec

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
_CALL = re.compile(r"\s*call:([^{\s]+)\s*(\{.*\})\s*", re.DOTALL)
_QUOTE_REGEX = re.escape(QUOTE).replace("/", "\\/")
_CLOSE_REGEX = re.escape(CLOSE).replace("/", "\\/")
# any value, unchecked: a tool without properties, or a schema the grammar does not type (its string's text, its
# closing quote's too where the text holds it: ``_Grammar._text``)
_ANY_VALUE = [
    'g_value: g_string | %json {"type": "number"} | "true" | "false" | "None" | g_object | g_array',
    'g_object: "{" (g_pair ("," g_pair)*)? "}"',
    'g_pair: /[^\\s:,{}\\[\\]<]+/ ":" g_value',  # a key as the template writes it: bare, any but its separators
    'g_array: "[" (g_value ("," g_value)*)? "]"',
]


def read_call(body: str) -> ParsedToolCall | None:
    """The call a block's text between ``<|tool_call>`` and ``<tool_call|>`` is, or None."""
    match = _CALL.fullmatch(body)
    if match is None or FUNCTION_NAME.fullmatch(match.group(1)) is None:
        return None
    arguments = read_arguments(match.group(2))
    return None if arguments is None else ParsedToolCall(match.group(1), json.dumps(arguments, ensure_ascii=False))


class Gemma4Parser:
    name = "gemma4"
    markers = (OPEN, CLOSE, QUOTE)
    special_tokens: Mapping[str, int] = NO_SPECIAL_TOKENS

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> HermesStream:
        return HermesStream(read_call, OPEN, CLOSE)

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        if not tools:
            raise ValueError("a forced tool call needs at least one tool")
        grammar = _Grammar(quote_is_token=QUOTE in self.special_tokens)
        alternatives = " | ".join(grammar.tool(tool) for tool in tools)
        lines = [f"start: call{' call*' if parallel else ''}",
                 f"call: {lark_literal(OPEN + 'call:')} ({alternatives}) {lark_literal(CLOSE)}"]
        return "\n".join(lines + grammar.lines) + "\n"

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        declarations = "".join(f"<|tool>declaration:{tool.name}{render_value(_declaration(tool))}<tool|>"
                               for tool in tools)
        return ("You can call the functions declared below. To call one, write "
                f"{OPEN}call:NAME{{key:value,...}}{CLOSE}, one block per call, a string value between {QUOTE} "
                f"markers.\n{declarations}")

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return "".join(f"{OPEN}call:{call.name}{_rendered_arguments(call)}{CLOSE}" for call in calls)

    def render_result(self, content: str, name: str | None) -> str:
        return f"<|tool_response>response:{name or 'unknown'}{{value:{QUOTE}{content}{QUOTE}}}<tool_response|>"

    def new_call_id(self) -> str:
        return hex_call_id()


def _declaration(tool: ToolSpec) -> dict[str, Any]:
    """A tool's description and parameters, as the template declares them (after ``declaration:NAME``)."""
    return {key: value for key, value in tool.openai_dict()["function"].items() if key != "name"}


def _rendered_arguments(call: ParsedToolCall) -> str:
    value = arguments_value(call.arguments)
    return render_value(value if isinstance(value, dict) else {"value": value})


class _Grammar:
    """The rules of one forced grammar, named as they are made. ``quote_is_token``: the tokenizer has ``<|"|>`` as
    a special token (Gemma 4's has), which then closes a string, as the model writes it; else the string's lazy
    text ends with the quote's characters."""

    def __init__(self, quote_is_token: bool = False) -> None:
        self.quote_is_token = quote_is_token
        self.lines: list[str] = []
        self._count = 0
        self._any = False
        self._refs: dict[str, str] = {}  # a $ref'd definition's rule, made once (a schema may refer to itself)

    def _rule(self, body: str, prefix: str = "r") -> str:
        self._count += 1
        name = f"{prefix}_{self._count}"
        self.lines.append(f"{name}: {body}")
        return name

    def tool(self, tool: ToolSpec) -> str:
        parameters = close_objects(dict(tool.parameters))
        defs = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
        return self._rule(f"{lark_literal(tool.name)} {self._object(parameters, defs)}", "tool")

    def _object(self, schema: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return self._any_value("g_object")
        required = set(schema.get("required") or ())
        # from the last key back: ``rest``, the arguments from this key on after one was written (each after a
        # comma); ``first``, those from this key on with none written yet ("": nothing may follow)
        rest = first = ""
        for key in reversed(sort_keys(properties)):
            pair = f"{lark_literal(key + ':')} {self._value(properties[key], defs)}"
            then = f" {rest}" if rest else ""
            if key in required:
                rest, first = self._rule(f'"," {pair}{then}'), self._rule(f"{pair}{then}")
            else:
                rest = self._rule(f'("," {pair})?{then}')
                first = self._rule(f"{pair}{then} | {first}" if first else f"({pair}{then})?")
        return f'"{{" {first} "}}"' if first else '"{" "}"'

    def _value(self, schema: Any, defs: Mapping[str, Any]) -> str:
        if not isinstance(schema, Mapping):
            return self._any_value("g_value")
        if "$ref" in schema:  # to the tool's $defs or definitions: one rule each, which may refer to itself
            name = str(schema["$ref"]).rsplit("/", 1)[-1]
            target = next((d[name] for d in defs.values() if isinstance(d, Mapping) and name in d), None)
            if not isinstance(target, Mapping):
                return self._any_value("g_value")
            if name not in self._refs:
                self._count += 1
                rule = self._refs[name] = f"ref_{self._count}"
                self.lines.append(f"{rule}: {self._value(target, defs)}")
            return self._refs[name]
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                return "(" + " | ".join(self._value(branch, defs) for branch in schema[key]) + ")"
        if "enum" in schema or "const" in schema:
            options = schema["enum"] if "enum" in schema else [schema["const"]]
            return "(" + " | ".join(lark_literal(render_value(option)) for option in options) + ")"
        kinds = schema.get("type")
        if isinstance(kinds, list):
            return "(" + " | ".join(self._value({**schema, "type": kind}, defs) for kind in kinds) + ")"
        if kinds == "string":
            return self._string(schema)
        if kinds == "null":
            return '"None"'
        if kinds in ("integer", "number", "boolean"):
            return json_value_grammar(schema, defs, JSON_STYLE)
        if kinds == "object":
            return self._object(schema, defs)
        if kinds == "array":
            items = schema.get("items")
            item = self._rule(self._value(items, defs) if isinstance(items, Mapping) else self._any_value("g_value"))
            return self._array(item, int(schema.get("minItems") or 0), schema.get("maxItems"))
        return self._any_value("g_value")

    def _array(self, item: str, low: int, high: Any) -> str:
        """``[`` ``low`` to ``high`` (None: any number of) ``item`` separated by commas ``]``."""
        if high is not None and int(high) <= 0:
            return '"[" "]"'
        more = f'("," {item})'
        repeats = "*" if high is None else f"{{{max(low, 1) - 1},{int(high) - 1}}}"
        items = f"{item} {more}{repeats}"
        return f'"[" {items} "]"' if low > 0 else f'"[" ({items})? "]"'

    def _string(self, schema: Mapping[str, Any]) -> str:
        """A string of no ``enum`` or ``const`` (:meth:`_value` writes those): ``<|"|>`` text ``<|"|>``."""
        self._count += 1
        return self._text(f"text_{self._count}", schema)

    def _text(self, rule: str, schema: Mapping[str, Any] | None) -> str:
        """A quoted string whose text is ``rule`` (made here), within ``schema``'s bounds."""
        if self.quote_is_token:
            self.lines += text_before_token(rule, schema, (QUOTE, CLOSE))
            return f"{lark_literal(QUOTE)} {rule} {lark_literal(QUOTE)}"
        self.lines += lazy_text(rule, _QUOTE_REGEX, schema, _CLOSE_REGEX)
        return f"{lark_literal(QUOTE)} {rule}"

    def _any_value(self, rule: str) -> str:
        """``rule`` of :data:`_ANY_VALUE` (``g_value`` or ``g_object``), whose lines are added once."""
        if not self._any:
            self._any = True
            self.lines += [*_ANY_VALUE, f"g_string: {self._text('g_text', None)}"]
        return rule

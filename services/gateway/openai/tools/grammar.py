"""Forced tool-call grammars (Lark, llguidance's dialect) and the tool descriptions of prompts, shared by
the per-family parsers.

A forced grammar is the family's exact format around ``%json`` call objects: each object's schema fixes
``name`` to one tool (``const``) and the arguments key (``arguments`` or ``parameters``) to that tool's
parameters schema, both required, nothing else. One alternative per tool. The JSON is written compactly,
as ``json.dumps`` does (``", "`` and ``": "``, no other whitespace), so a model cannot pad a call with
endless whitespace. Objects of a parameters schema that list ``properties`` and say nothing of others are
closed, as OpenAI's ``strict`` has it; every output still validates against the schema as written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from services.engine.structured.schema_tools import close_objects
from services.gateway.openai.tools.types import ToolSpec

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_DEFS = ("$defs", "definitions")


def call_schema(tool: ToolSpec, arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call of ``tool``: ``{"name": <tool>, <arguments_key>: <its parameters>}``.
    ``$defs``/``definitions`` of the parameters move to the root, where their ``#/$defs/…`` refs point."""
    parameters = close_objects(dict(tool.parameters))
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }
    for key in _DEFS:
        if isinstance(parameters.get(key), Mapping):
            schema[key] = parameters.pop(key)
    schema["x-guidance"] = dict(JSON_STYLE)
    return schema


def lark_literal(text: str) -> str:
    """A Lark string literal of ``text`` (JSON's escapes; astral characters kept whole)."""
    return json.dumps(text, ensure_ascii=False)


def forced_grammar(tools: Sequence[ToolSpec], arguments_key: str, parallel: bool, *, head: str = "",
                   open_: str = "", close: str = "", separator: str = "", tail: str = "") -> str:
    """``head`` call (``separator`` call)* ``tail`` when ``parallel``, else ``head`` call ``tail``; each call
    is ``open_`` + a call object of one of ``tools`` + ``close``."""
    if not tools:
        raise ValueError("a forced tool call needs at least one tool")
    lines = []
    more = f" ({lark_literal(separator)} call)*" if separator else " call*"
    body = "call" + (more if parallel else "")
    lines.append("start: " + " ".join(part for part in (_lit(head), body, _lit(tail)) if part))
    lines.append("call: " + " ".join(part for part in (_lit(open_), "call_object", _lit(close)) if part))
    lines.append("call_object: " + " | ".join(f"tool_{i}" for i in range(len(tools))))
    for i, tool in enumerate(tools):
        lines.append(f"tool_{i}: %json " + json.dumps(call_schema(tool, arguments_key), ensure_ascii=False))
    return "\n".join(lines) + "\n"


def _lit(text: str) -> str:
    return lark_literal(text) if text else ""


def tool_lines(tools: Sequence[ToolSpec]) -> str:
    """Each tool as one line of JSON (its name, description and parameters schema)."""
    return "\n".join(json.dumps(tool.openai_dict()["function"], ensure_ascii=False) for tool in tools)

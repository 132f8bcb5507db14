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
import re
from collections.abc import Mapping, Sequence
from typing import Any

from services.engine.structured.schema_tools import close_objects
from services.gateway.openai.tools.types import ToolSpec

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_DEFS = ("$defs", "definitions")
# what a scan of a grammar's text steps over whole: a %json body (its JSON read to its end), a /regex/, a "literal"
_LARK_PIECE = re.compile(r'%json\s*|/(?:\\.|[^/\\\n])+/[imslux]*|"(?:\\.|[^"\\\n])*"')


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


def marked_literal(text: str, special_tokens: Mapping[str, int]) -> str:
    """``text`` as a Lark sequence: each of ``special_tokens`` in it (by text) as that token, ``<[id]>``, the rest
    as string literals."""
    if not special_tokens or not any(marker in text for marker in special_tokens):
        return lark_literal(text)
    markers = "|".join(re.escape(m) for m in sorted(special_tokens, key=len, reverse=True))
    return " ".join(f"<[{special_tokens[piece]}]>" if piece in special_tokens else lark_literal(piece)
                    for piece in re.split(f"({markers})", text) if piece)


def with_special_tokens(grammar: str, special_tokens: Mapping[str, int]) -> str:
    """``grammar`` with its string literals' markers that are special tokens of the model's tokenizer
    (``special_tokens``: their ids, by text) written as those tokens (:func:`marked_literal`). llguidance never
    writes a special token for a literal's text (it spells ``"<|tool_call>"`` in ordinary tokens), while a model
    writes its markers as their tokens; the decoded text, which the parsers read, is the same. Regexes and
    ``%json`` bodies are kept as they are."""
    if not special_tokens:
        return grammar
    out, at = [], 0
    while (piece := _LARK_PIECE.search(grammar, at)) is not None:
        out.append(grammar[at:piece.start()])
        if piece.group().startswith("%json"):
            _, at = json.JSONDecoder().raw_decode(grammar, piece.end())
            out.append(grammar[piece.start():at])
            continue
        text = piece.group()
        out.append(marked_literal(json.loads(text), special_tokens) if text.startswith('"') else text)
        at = piece.end()
    return "".join(out) + grammar[at:]

"""What the formats that write arguments as tagged text (GLM's, Qwen3-Coder's) share: reading a value back by
its schema (a string's text is written bare, so only the schema tells ``"123"`` from ``123``), a function's name,
and the forced grammar's lazy text values.

A string value in a forced grammar is one lazy lexeme that ends with the value's closing tag: llguidance's lexer
never backtracks, so a lexeme of "any text without the tag" would read on through the tag's first characters and
never let it match; a lazy one ends at the first place it can, the first closing tag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from services.gateway.openai.tools.types import ToolSpec

FUNCTION_NAME = re.compile(r"[\w.:\-]+")  # a function's name as OpenAI allows them (and dots, colons: MCP's)


def _branches(schema: Mapping[str, Any]) -> list[Any] | None:
    """The non-null branches of an ``anyOf``/``oneOf`` (Pydantic's optional fields), or None without one."""
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [b for b in schema[key] if not (isinstance(b, Mapping) and b.get("type") == "null")]
    return None


def is_string_schema(schema: Any) -> bool:
    """Whether an argument of ``schema`` is a string, written bare (its type ``string``, or ``string`` and
    ``null``; an ``anyOf``/``oneOf`` of strings and null; no type but an ``enum`` or ``const`` of strings). A
    ``$ref`` is not followed."""
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if isinstance(kind, list):
        return [k for k in kind if k != "null"] == ["string"]
    if kind is not None:
        return kind == "string"
    branches = _branches(schema)
    if branches is not None:
        return bool(branches) and all(is_string_schema(b) for b in branches)
    options = string_options(schema)
    return bool(options) and len(options) == len(_options(schema))


def is_nullable(schema: Any) -> bool:
    """Whether ``schema`` allows null (in its ``type`` list, or as a branch of its ``anyOf``/``oneOf``)."""
    if not isinstance(schema, Mapping):
        return False
    if isinstance(schema.get("type"), list):
        return "null" in schema["type"]
    branches = _branches(schema)
    return branches is not None and len(branches) < len(schema.get("anyOf") or schema.get("oneOf") or ())


def schema_type(schema: Any) -> str | None:
    """The one non-null ``type`` of ``schema``, or None (none, or several)."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    kinds = [k for k in kind if k != "null"] if isinstance(kind, list) else [kind] if kind else []
    return kinds[0] if len(kinds) == 1 else None


def _options(schema: Mapping[str, Any]) -> list[Any]:
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    return [schema["const"]] if "const" in schema else []


def string_options(schema: Mapping[str, Any]) -> list[str]:
    """The strings of an ``enum`` or ``const``."""
    return [option for option in _options(schema) if isinstance(option, str)]


def property_schema(tools: Sequence[ToolSpec], name: str, key: str) -> Any:
    """The schema ``tools`` give argument ``key`` of function ``name`` (None: not described)."""
    for tool in tools:
        if tool.name == name:
            properties = tool.parameters.get("properties")
            return properties.get(key) if isinstance(properties, Mapping) else None
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_value(text: str) -> Any:
    """``text`` read as JSON, or ``text`` itself where it is not JSON (``NaN`` and ``Infinity`` are not)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return text


def lazy_text(rule: str, close: str, schema: Mapping[str, Any] | None = None,
              block_close: str = r"<\/tool_call>") -> list[str]:
    """Lark lines for ``rule``: any text up to and including the first ``close`` (a regex of the closing tag,
    ``/`` escaped), within the ``minLength`` and ``maxLength`` of ``schema`` where it has them (its ``pattern``
    and ``format`` are not held), and without ``block_close`` (a regex of the tag that would end the call's
    block: ``</tool_call>``, or the format's own)."""
    terminal = rule.upper()
    return [f"{rule}[lazy]: {terminal}",
            f"{terminal}: /(.|\\n){_length(schema)}{close}/ & ~/(.|\\n)*{close}(.|\\n)+/"
            f" & ~/(.|\\n)*{block_close}(.|\\n)*/"]


def text_before_token(rule: str, schema: Mapping[str, Any] | None, excluded: Sequence[str]) -> list[str]:
    """Lark lines for ``rule``: text within the ``minLength`` and ``maxLength`` of ``schema`` where it has them,
    holding none of the ``excluded`` texts, for a value that a special token closes (a token text cannot hold,
    so the lexeme ends where the model writes it: no lazy match needed)."""
    terminal = rule.upper()
    excluded_regex = "|".join(re.escape(text).replace("/", "\\/") for text in excluded)
    return [f"{rule}: {terminal}",
            f"{terminal}: /(.|\\n){_length(schema)}/ & ~/(.|\\n)*({excluded_regex})(.|\\n)*/"]


def _length(schema: Mapping[str, Any] | None) -> str:
    """The regex repetition of a string's characters within ``schema``'s ``minLength`` and ``maxLength``."""
    low, high = int((schema or {}).get("minLength") or 0), (schema or {}).get("maxLength")
    return "*" if not low and high is None else f"{{{low},{'' if high is None else int(high)}}}"


def json_value_grammar(schema: Any, defs: Mapping[str, Any], style: Mapping[str, Any]) -> str:
    """``%json`` of ``schema`` (with the tool's ``$defs``, where its refs point) in ``style``."""
    body = {**(dict(schema) if isinstance(schema, Mapping) else {}), **defs, "x-guidance": dict(style)}
    return "%json " + json.dumps(body, ensure_ascii=False)

"""JSON-schema helpers of the compiler: OpenAI-``strict``-like closing of objects, and finding where in a
schema the error the grammar library reports lies (llguidance names the problem, not the place).

Only the keywords that hold schemas are walked (``properties``, ``items``, ``anyOf``, ``$defs``…), never
``enum``, ``const``, ``default`` or ``examples``, whose values are data.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator

_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
MAX_LOCATE_TRIES = 64  # compiles spent looking for the place of an error


def children(schema: dict) -> Iterator[tuple[tuple[str, ...], dict]]:
    """``(keys from schema, subschema)`` of each object-valued subschema (boolean schemas are skipped)."""
    for key in _ONE:
        if isinstance(schema.get(key), dict):
            yield (key,), schema[key]
    for key in _MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                if isinstance(sub, dict):
                    yield (key, str(name)), sub
    for key in _LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                if isinstance(sub, dict):
                    yield (key, str(i)), sub


def close_objects(schema: dict) -> dict:
    """A copy of ``schema`` where an object schema that lists ``properties`` but says nothing of others
    (no ``additionalProperties``, ``patternProperties`` or ``unevaluatedProperties``) allows no others, as
    OpenAI's ``strict`` mode has it. Every output still validates against the schema as written. Members of
    an ``allOf`` are left open: closing each would refuse the properties of its siblings."""
    closed = copy.deepcopy(schema)
    _close(closed, in_all_of=False)
    return closed


def _close(schema: dict, in_all_of: bool) -> None:
    if "properties" in schema and not in_all_of and not any(k in schema for k in _OPEN_KEYS):
        schema["additionalProperties"] = False
    for keys, sub in children(schema):
        _close(sub, in_all_of=keys[0] == "allOf")


def locate_error(root: dict, message: str, error_of: Callable[[dict], str]) -> str:
    """The JSON pointer (``#/properties/a/items``) of the deepest subschema of ``root`` that fails alone
    with the same ``message`` (``error_of(schema)``: the library's error, "" when it compiles); the
    root's ``$defs``/``definitions`` go along so references resolve. ``#`` when no smaller part does."""
    defs = {k: root[k] for k in ("$defs", "definitions") if isinstance(root.get(k), dict)}
    path: list[str] = []
    node, tries = root, MAX_LOCATE_TRIES
    while tries > 0:
        for keys, child in children(node):
            tries -= 1
            if error_of({**defs, **child}) == message:
                path.extend(keys)
                node = child
                break
            if tries <= 0:
                break
        else:
            break
    return "#" + "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in path)


def parse_schema(text: str) -> tuple[dict | None, str]:
    """``(schema, "")`` for JSON text holding an object, else ``(None, what is wrong)``."""
    try:
        schema = json.loads(text)
    except ValueError as e:
        return None, f"the JSON schema is not valid JSON: {e}"
    if not isinstance(schema, dict):
        return None, f"the JSON schema must be a JSON object, got {type(schema).__name__}"
    return schema, ""

"""A body's output constraint → the ``StructuredSpec`` its ``SamplingFields.structured`` carries.

The forms taken, one at a time (two given: a 400 naming both):

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``, or
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`` (OpenAI's;
  ``name`` and ``schema`` required, on chat and completions as vLLM takes it);
- vLLM's ``guided_json`` (a schema object or its JSON text), ``guided_regex``, ``guided_choice`` (a list of
  strings), ``guided_grammar`` (Lark, as llguidance reads it);
- vLLM's ``structured_outputs``: ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``, plus
  ``disable_additional_properties`` (as strict below) and ``disable_fallback`` (no effect: nothing falls
  back here).

``strict``: the engine's compiler gives every schema OpenAI's strict semantics for objects: an object schema
that lists ``properties`` and says nothing of others (no ``additionalProperties``, ``patternProperties``,
``unevaluatedProperties``) allows no others. ``json_schema.strict = true`` (what the ``openai`` package's
``parse`` sends) and ``structured_outputs.disable_additional_properties`` pass the schema as given (closed
by the compiler).
``strict = false`` (OpenAI's default), ``guided_json`` and ``structured_outputs.json`` keep JSON Schema's
meaning, as vLLM does: each such object gets an explicit ``additionalProperties: true``, so the output may
have keys the schema does not name. Either way ``required`` is as written, and every output validates
against the schema as the client wrote it.

The schema's text is its JSON with the keys in the order given: the order of ``properties`` is the order the
output's keys are generated in, so sorting keys (for a cache key independent of it) would change the output.
A shape error is a 400 naming the param (``response_format.json_schema.schema``); whether a schema, regex or
grammar compiles is checked by the gateway (its ``structured_output`` errors renamed by :func:`renamed_error`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from services.engine.errors import InvalidRequestError
from services.engine.structured_spec import StructuredSpec
from services.gateway.openai.errors import OpenAIError
from services.gateway.openai.schemas import GenerationBody

WIRE_FIELDS = ("structured_output", "structured")  # the gateway's names of the constraint (longest first)
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_OUTPUTS_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_OUTPUTS_OPTIONS = ("disable_additional_properties", "disable_fallback")
# keywords whose value is a schema, a list of schemas, a map of name → schema
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "additionalItems", "unevaluatedProperties", "unevaluatedItems")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")  # say what else may come


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param)


def opened_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: true`` on every object schema that lists ``properties`` and
    says nothing of others (a copy; JSON Schema's default made explicit, so the compiler does not close it;
    what is not a schema is left as it is)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and not any(key in out for key in _OPEN_KEYS):
        out["additionalProperties"] = True
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = opened_objects(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [opened_objects(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: opened_objects(s) for name, s in out[key].items()}
    return out


def _schema_spec(param: str, schema: Any, strict: bool) -> StructuredSpec:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as error:
            raise _bad(param, f"not valid JSON: {error}") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise _bad(param, f"a JSON schema must be an object, got {type(schema).__name__}")
    text = json.dumps(schema if strict else opened_objects(schema), ensure_ascii=False, separators=(",", ":"))
    return StructuredSpec("json_schema", text)


def _text_spec(kind: str) -> Callable[[str, Any], StructuredSpec]:
    def spec(param: str, value: Any) -> StructuredSpec:
        if not isinstance(value, str) or not value:
            raise _bad(param, f"expected a non-empty string, got {value!r}"[:300])
        return StructuredSpec(kind, value)
    return spec


def _choice_spec(param: str, value: Any) -> StructuredSpec:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise _bad(param, f"expected a non-empty list of strings, got {value!r}"[:300])
    return StructuredSpec("choice", choices=tuple(value))


def _response_format(value: Any) -> StructuredSpec | None:
    param = "response_format"
    if not isinstance(value, dict):
        raise _bad(param, f"expected an object, got {value!r}"[:300])
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec("json_object")
    if kind != "json_schema":
        raise _bad(f"{param}.type", f"expected 'text', 'json_object' or 'json_schema', got {kind!r}")
    described = value.get("json_schema")
    if not isinstance(described, dict):
        raise _bad(f"{param}.json_schema", "json_schema needs an object {name, schema, strict, description}")
    name = described.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{param}.json_schema.name", f"expected a non-empty string, got {name!r}"[:300])
    strict = described.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(f"{param}.json_schema.strict", f"expected a boolean, got {strict!r}")
    if "schema" not in described or described["schema"] is None:
        raise _bad(f"{param}.json_schema.schema", "a JSON schema is required")
    if not isinstance(described["schema"], dict):
        raise _bad(f"{param}.json_schema.schema", "a JSON schema must be an object")
    return _schema_spec(f"{param}.json_schema.schema", described["schema"], bool(strict))


def _structured_outputs(value: Any) -> tuple[str, StructuredSpec]:
    """(the param of the kind given, its spec)."""
    if not isinstance(value, dict):
        raise _bad("structured_outputs", f"expected an object, got {value!r}"[:300])
    for key in value:
        if key not in _OUTPUTS_KINDS + _OUTPUTS_OPTIONS and value[key] not in (None, False, ""):
            raise _bad(f"structured_outputs.{key}", "not supported by this server")
    given = [k for k in _OUTPUTS_KINDS if value.get(k) not in (None, False)]
    if len(given) != 1:
        raise _bad("structured_outputs", f"give exactly one of {', '.join(_OUTPUTS_KINDS)}, got "
                   f"{', '.join(given) or 'none'}")
    kind, param = given[0], f"structured_outputs.{given[0]}"
    if kind == "json_object":
        if value[kind] is not True:
            raise _bad(param, f"expected true, got {value[kind]!r}")
        return param, StructuredSpec("json_object")
    if kind == "json":
        return param, _schema_spec(param, value[kind], bool(value.get("disable_additional_properties")))
    return param, _SPEC_OF[kind](param, value[kind])


_SPEC_OF: dict[str, Callable[[str, Any], StructuredSpec]] = {
    "regex": _text_spec("regex"), "grammar": _text_spec("grammar"), "choice": _choice_spec}


def _given(body: GenerationBody) -> dict[str, Any]:
    """The constraint params the body sets (``response_format`` of type text counts as not set)."""
    extra = body.model_extra or {}
    given = {name: extra[name] for name in ("response_format", *GUIDED, "structured_outputs")
             if extra.get(name) is not None}
    if isinstance(given.get("response_format"), dict) and given["response_format"].get("type") == "text":
        del given["response_format"]
    return given


def constraint_param(body: GenerationBody) -> str | None:
    """The param the body's constraint came from (``structured_outputs.<kind>`` for that form), None
    without one."""
    given = _given(body)
    param = next(iter(given), None)
    outputs = given.get("structured_outputs")
    if param == "structured_outputs" and isinstance(outputs, dict):
        kinds = [k for k in _OUTPUTS_KINDS if outputs.get(k) not in (None, False)]
        return f"{param}.{kinds[0]}" if len(kinds) == 1 else param
    return param


def renamed_error(body: GenerationBody, error: BaseException, fallback: str | None = None) -> OpenAIError | None:
    """The gateway's refusal of the constraint (an ``InvalidRequestError`` naming ``structured_output``:
    a schema, regex or grammar that does not compile, ...) as a 400 naming the body's param (``fallback``
    when the constraint is not one of the body's, e.g. ``tools`` for a forced call's grammar); None for any
    other error."""
    if not isinstance(error, InvalidRequestError) or not error.field.startswith(WIRE_FIELDS):
        return None
    param = constraint_param(body) or fallback
    if param is None:
        return None
    field = error.field
    path = field[len(next(f for f in WIRE_FIELDS if field.startswith(f))):]  # a JSON path the gateway named
    return OpenAIError(400, f"{param}{path}: {error.message}", param=param)


def structured_of(body: GenerationBody) -> StructuredSpec | None:
    """The body's constraint, shape-checked (a 400 naming its param), or None."""
    given = _given(body)
    if len(given) > 1:
        first, second = list(given)[:2]
        raise OpenAIError(400, f"{second}: {first} and {second} both constrain the output; give one of them",
                          param=second)
    if not given:
        return None
    ((param, value),) = given.items()
    if param == "response_format":
        spec = _response_format(value)
    elif param == "structured_outputs":
        param, spec = _structured_outputs(value)
    elif param == "guided_json":
        spec = _schema_spec(param, value, strict=False)
    else:
        spec = {"guided_regex": _text_spec("regex"), "guided_grammar": _text_spec("grammar"),
                "guided_choice": _choice_spec}[param](param, value)
    if spec is not None:
        spec.check_shape(field=param)
    return spec

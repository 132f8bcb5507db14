"""Each form of an output constraint in an OpenAI body → ``SamplingFields.structured``; shape errors are 400s
naming the param; two constraints at once are refused naming both; the gateway's refusal of a constraint
is renamed to the body's param."""

from __future__ import annotations

import json

import pytest

from services.engine.errors import InvalidRequestError
from services.engine.structured_spec import MAX_SPEC_CHARS, StructuredSpec
from services.gateway.openai import translate
from services.gateway.openai.errors import OpenAIError
from services.gateway.openai.schemas import ChatCompletionBody, CompletionBody
from services.gateway.openai.structured import constraint_param, opened_objects, renamed_error

CHAT = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
SCHEMA_TEXT = json.dumps(SCHEMA, separators=(",", ":"))
OPEN_TEXT = json.dumps({**SCHEMA, "additionalProperties": True}, separators=(",", ":"))  # not strict


def json_schema(strict: bool | None = None, schema=SCHEMA) -> dict:
    described = {"name": "person", "schema": schema, "description": "a person"}
    return {"type": "json_schema", "json_schema": described if strict is None else {**described, "strict": strict}}


FORMS = [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, StructuredSpec("json_object")),
    ({"response_format": json_schema()}, StructuredSpec("json_schema", OPEN_TEXT)),
    ({"response_format": json_schema(strict=False)}, StructuredSpec("json_schema", OPEN_TEXT)),
    ({"response_format": json_schema(strict=True)}, StructuredSpec("json_schema", SCHEMA_TEXT)),
    ({"guided_json": SCHEMA}, StructuredSpec("json_schema", OPEN_TEXT)),
    ({"guided_json": json.dumps(SCHEMA, indent=2)}, StructuredSpec("json_schema", OPEN_TEXT)),
    ({"guided_regex": r"\d{3}-[a-z]+"}, StructuredSpec("regex", r"\d{3}-[a-z]+")),
    ({"guided_choice": ["yes", "no"]}, StructuredSpec("choice", choices=("yes", "no"))),
    ({"guided_grammar": 'start: "a" | "b"'}, StructuredSpec("grammar", 'start: "a" | "b"')),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredSpec("json_schema", OPEN_TEXT)),
    ({"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
     StructuredSpec("json_schema", SCHEMA_TEXT)),
    ({"structured_outputs": {"regex": "a+"}}, StructuredSpec("regex", "a+")),
    ({"structured_outputs": {"choice": ["x"]}}, StructuredSpec("choice", choices=("x",))),
    ({"structured_outputs": {"grammar": 'start: "a"'}}, StructuredSpec("grammar", 'start: "a"')),
    ({"structured_outputs": {"json_object": True, "disable_fallback": True}}, StructuredSpec("json_object")),
    ({"guided_json": None, "response_format": None}, None),
    ({}, None),
]


@pytest.mark.parametrize(("fields", "expected"), FORMS)
def test_each_form_maps_to_its_spec_on_both_endpoints(fields, expected):
    completion = CompletionBody.model_validate({"prompt": "Hi", **fields})
    assert translate.completion_inputs(completion, "r")[0].sampling.structured == expected
    chat = ChatCompletionBody.model_validate({"messages": CHAT, **fields})
    assert translate.chat_input(chat, "r").sampling.structured == expected


def test_the_schema_keeps_its_key_order():
    """The order of ``properties`` is the order the output's keys come in: not sorted."""
    schema = {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}
    body = ChatCompletionBody.model_validate({"messages": CHAT, "guided_json": schema})
    text = translate.chat_input(body, "r").sampling.structured.text
    assert list(json.loads(text)["properties"]) == ["zeta", "alpha"]
    again = ChatCompletionBody.model_validate({"messages": CHAT, "guided_json": json.dumps(schema)})
    assert translate.chat_input(again, "r").sampling.structured.key == translate.chat_input(body, "r"
                                                                                          ).sampling.structured.key


def test_not_strict_keeps_objects_open_where_the_schema_is_silent():
    """The compiler closes an object that lists ``properties`` and says nothing of others (strict); a schema
    that is not strict says so explicitly where it is silent, and only there."""
    schema = {"type": "object", "$defs": {"Pet": {"type": "object", "properties": {"kind": {"type": "string"}}}},
              "properties": {"pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
                             "meta": {"type": "object", "properties": {}, "additionalProperties": False},
                             "tags": {"properties": {}, "patternProperties": {"^x": {"type": "string"}}},
                             "either": {"anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]},
                             "bare": {"type": "object"},
                             "enum": {"enum": [{"properties": {}}]}}}
    opened = opened_objects(schema)
    assert opened["additionalProperties"] is True
    assert opened["$defs"]["Pet"]["additionalProperties"] is True
    assert opened["properties"]["meta"]["additionalProperties"] is False  # said otherwise: kept
    assert "additionalProperties" not in opened["properties"]["tags"]
    assert opened["properties"]["either"]["anyOf"][0]["additionalProperties"] is True
    assert opened["properties"]["bare"] == {"type": "object"}  # no properties: the compiler leaves it open
    assert opened["properties"]["enum"]["enum"] == [{"properties": {}}]  # a value, not a schema
    assert "additionalProperties" not in schema  # the body's schema is not changed


BAD = [
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": json_schema(schema=[1])}, "response_format.json_schema.schema"),
    ({"response_format": json_schema(strict="yes")}, "response_format.json_schema.strict"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": 5}, "guided_json"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_regex": ["a"]}, "guided_regex"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_choice": ["yes", 1]}, "guided_choice"),
    ({"guided_grammar": 3}, "guided_grammar"),
    ({"guided_regex": "a" * (MAX_SPEC_CHARS + 1)}, "guided_regex"),
    ({"guided_choice": ["c"] * 1025}, "guided_choice"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
]


@pytest.mark.parametrize(("fields", "param"), BAD)
def test_a_shape_error_names_the_param(fields, param):
    body = ChatCompletionBody.model_validate({"messages": CHAT, **fields})
    with pytest.raises((OpenAIError, InvalidRequestError)) as raised:
        translate.chat_input(body, "r")
    named = raised.value.detail.param if isinstance(raised.value, OpenAIError) else raised.value.field
    assert named == param


@pytest.mark.parametrize(("fields", "names"), [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, ("response_format", "guided_regex")),
    ({"guided_json": SCHEMA, "guided_choice": ["a"]}, ("guided_json", "guided_choice")),
    ({"guided_grammar": "start: 'a'", "structured_outputs": {"regex": "a"}}, ("guided_grammar", "structured_outputs")),
])
def test_two_constraints_are_refused_naming_both(fields, names):
    body = CompletionBody.model_validate({"prompt": "Hi", **fields})
    with pytest.raises(OpenAIError) as raised:
        translate.completion_inputs(body, "r")
    assert raised.value.status == 400
    assert all(name in str(raised.value) for name in names)
    assert raised.value.detail.param in names


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": json_schema()}, "response_format"),
    ({"guided_regex": "(a"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "start: ?"}}, "structured_outputs.grammar"),
])
def test_the_gateways_refusal_is_named_as_the_body_has_it(fields, param):
    body = ChatCompletionBody.model_validate({"messages": CHAT, **fields})
    assert constraint_param(body) == param
    renamed = renamed_error(body, InvalidRequestError("structured_output", "does not compile: bad"))
    assert renamed is not None and renamed.status == 400
    assert (renamed.detail.param, renamed.detail.message) == (param, f"{param}: does not compile: bad")
    assert renamed_error(body, InvalidRequestError("temperature", "bad")) is None
    plain = ChatCompletionBody.model_validate({"messages": CHAT})
    assert renamed_error(plain, InvalidRequestError("structured_output", "x")) is None

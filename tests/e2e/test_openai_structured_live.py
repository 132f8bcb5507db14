"""Structured outputs through the HTTP front on the session's live cluster (real processes, the bundled model,
float32 greedy), with the official ``openai`` package unchanged: ``parse`` with a pydantic model,
``json_schema`` strict (streamed and not: the same text), ``json_object``, vLLM's ``guided_choice``,
``guided_regex`` and ``guided_grammar``; a schema, regex or grammar the compiler refuses is a 400 naming the
param, and the cluster is idle and serving afterwards. Tools on a template with no tool section (SmolLM2's:
the front describes them in a system block in the parser's format): ``tool_choice`` ``required`` gives a
call whose arguments validate against the tool's parameters, ``auto`` an answer that is content or a call."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.conftest import wait_idle

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0.0, "max_tokens": 160}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "likes": {"type": "array", "items": {"enum": ["tea", "cats", "rain"]},
                                                     "maxItems": 3}},
          "required": ["name", "age", "likes"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}


def ask(what: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": what}]


class City(BaseModel):
    name: str = Field(max_length=24)
    country: Literal["France", "Italy", "Spain", "Other"]
    capital: bool


@pytest.fixture(scope="module")
def client(cluster):
    with openai.OpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused", max_retries=0, timeout=300) as made:
        yield made


def test_parse_returns_the_pydantic_object(client):
    completion = client.chat.completions.parse(model=MODEL, messages=ask("Describe Paris as JSON."),
                                               response_format=City, **GREEDY)
    (choice,) = completion.choices
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_strict_json_schema_streamed_and_not(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    whole = client.chat.completions.create(model=MODEL, messages=ask("Invent a person."),
                                           response_format=response_format, **GREEDY)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "stop"
    person = json.loads(text)
    jsonschema.validate(person, {**PERSON, "additionalProperties": False})
    stream = client.chat.completions.create(model=MODEL, messages=ask("Invent a person."), stream=True,
                                            response_format=response_format, **GREEDY)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object_on_both_endpoints(client):
    cat = ask("Reply with a JSON object with keys name and colour for a cat.")
    chat = client.chat.completions.create(model=MODEL, messages=cat, response_format={"type": "json_object"}, **GREEDY)
    assert chat.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    completion = client.completions.create(model=MODEL, prompt="A JSON object:", extra_body={
        "response_format": {"type": "json_object"}}, **GREEDY)
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(completion.choices[0].text), dict)


def test_guided_choice_regex_and_grammar(client):
    choices = ["sunny", "rainy", "foggy"]
    chat = client.chat.completions.create(model=MODEL, messages=ask("Weather in London?"),
                                          extra_body={"guided_choice": choices}, **GREEDY)
    assert chat.choices[0].message.content in choices
    pattern = r"[A-Z][a-z]{2,8}-\d{3}"
    regex = client.completions.create(model=MODEL, prompt="A product code:", extra_body={"guided_regex": pattern},
                                      **GREEDY)
    assert re.fullmatch(pattern, regex.choices[0].text), regex.choices[0].text
    grammar = 'start: "(" item ("," item)* ")"\nitem: "a" | "b" | "c"\n'
    lark = client.completions.create(model=MODEL, prompt="A list:", **{**GREEDY, "max_tokens": 24}, extra_body={
        "structured_outputs": {"grammar": grammar}})
    text, finish = lark.choices[0].text, lark.choices[0].finish_reason
    assert re.fullmatch(r"\([abc](,[abc])*\)" if finish == "stop" else r"\([abc](,[abc])*,?", text), text


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wibble"}}}},
     "response_format"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "start: ???"}, "guided_grammar"),
    ({"structured_outputs": {"json": {"$ref": "#/$defs/missing"}}}, "structured_outputs.json"),
])
def test_what_the_compiler_refuses_is_a_400_naming_the_param(client, stub, body, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=ask("Hi"), extra_body=body, **GREEDY)
    error = raised.value.body
    assert error["param"] == param and error["message"].startswith(f"{param}:"), error
    wait_idle(stub)
    assert client.chat.completions.create(model=MODEL, messages=ask("Hi"), max_tokens=2).choices[0].message.content


def test_required_tool_choice_gives_a_call_valid_against_its_parameters(client):
    completion = client.chat.completions.create(model=MODEL, messages=ask("What is the weather in Paris?"),
                                                tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                                **GREEDY)
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather", call
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert not choice.message.content


def test_auto_tool_choice_answers_with_content_or_a_call(client):
    completion = client.chat.completions.create(model=MODEL, messages=ask("What is the weather in Paris?"),
                                                tools=[WEATHER], tool_choice="auto", **GREEDY)
    (choice,) = completion.choices
    calls = choice.message.tool_calls or []
    if calls:
        assert choice.finish_reason == "tool_calls"
        assert all(c.function.name and isinstance(json.loads(c.function.arguments), dict) for c in calls), calls
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.content, choice

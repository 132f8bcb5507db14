"""Output constraints through the HTTP front over fake nodes: what the official ``openai`` package sends
reaches the nodes as ``SamplingParams.structured``, its ``parse`` reads the answer, and bad constraints are
refused before any node works."""

from __future__ import annotations

import json

import pytest
from pdserve.v1 import decode_pb2, gateway_pb2
from pydantic import BaseModel

from tests.gateway.openai.conftest import MODEL
from tests.gateway.openai.test_openai_front_api import script
from tests.gateway.openai.test_openai_front_errors import assert_serving, error_of

CHAT = [{"role": "user", "content": "Who?"}]


class Person(BaseModel):
    name: str
    age: int


def script_stop(front, tokenizer, text: str) -> None:
    """P answers the first token of ``text``; D the rest, ending with ``stop`` (the grammar was complete)."""
    ids = tokenizer.encode(text)
    front.cluster.p.first_token = ids[0]

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:], finish_reason="stop",
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)))

    front.cluster.d.script = attach


async def test_parse_sends_a_strict_schema_and_reads_the_answer(front, tokenizer):
    script_stop(front, tokenizer, '{"name": "Ann", "age": 7}')
    completion = await front.client.chat.completions.parse(model=MODEL, messages=CHAT, response_format=Person)
    assert completion.choices[0].message.parsed == Person(name="Ann", age=7)

    structured = front.cluster.p.requests[0].sampling.structured
    assert structured.WhichOneof("kind") == "json_schema"
    schema = json.loads(structured.json_schema)
    assert schema["additionalProperties"] is False and schema["required"] == ["name", "age"]
    assert list(schema["properties"]) == ["name", "age"]  # the order the keys are generated in


@pytest.mark.parametrize(("extra", "kind", "value"), [
    ({"response_format": {"type": "json_object"}}, "json_object", True),
    ({"guided_regex": "[a-z]+"}, "regex", "[a-z]+"),
    ({"guided_grammar": 'start: "x"'}, "grammar", 'start: "x"'),
    ({"structured_outputs": {"json": {"type": "integer"}}}, "json_schema", '{"type":"integer"}'),
])
async def test_each_form_reaches_the_nodes(front, tokenizer, extra, kind, value):
    ids = script(front, tokenizer)
    completion = await front.client.completions.create(model=MODEL, prompt="Hi", max_tokens=len(ids),
                                                       extra_body=extra)
    assert completion.choices[0].text == tokenizer.decode(ids)
    structured = front.cluster.p.requests[0].sampling.structured
    assert structured.WhichOneof("kind") == kind and getattr(structured, kind) == value


async def test_a_choice_reaches_the_nodes_on_a_stream(front, tokenizer):
    script(front, tokenizer)
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, stream=True,
                                                        extra_body={"guided_choice": ["yes", "no"]})
    assert [chunk async for chunk in stream][-1].choices[0].finish_reason == "length"
    assert list(front.cluster.p.requests[0].sampling.structured.choice.choices) == ["yes", "no"]


async def test_no_constraint_sends_none(front, tokenizer):
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=CHAT, response_format={"type": "text"})
    assert not front.cluster.p.requests[0].sampling.HasField("structured")


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}},
     "response_format.json_schema.schema"),
    ({"guided_json": "{"}, "guided_json"),
    ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs"),
    # what the gateway's compile refuses (INVALID_ARGUMENT naming structured_output): named as the body has it
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"structured_outputs": {"json": {"type": "wibble"}}}, "structured_outputs.json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/none"}}}},
     "response_format"),
])
async def test_bad_constraints_are_400_and_call_no_node(front, tokenizer, body, param):
    for stream in (False, True):
        reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT, "stream": stream, **body})
        error = error_of(reply, 400)
        assert (error["type"], error["param"]) == ("invalid_request_error", param), error
        assert error["message"].startswith(f"{param}") and "[internal]" not in error["message"], error
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)

"""Tool calling and reasoning content through the HTTP front on one real disaggregated cluster (gateway with
``--reasoning-parser qwen3``, a prefill node, a decode node) serving the tiny RANDOM-weight chat family
(tests/engine/tiny_chat_family.py: Qwen3's markers and a template with a tool section), with the official
``openai`` package unchanged. Nothing but the grammar can make a random model's calls valid.

With the reasoning parser on, a forced call or a ``response_format`` applies after ``</think>``: the output
is free until that token. A random model does not end its thinking by itself, so each constrained request
here raises the ``</think>`` token with ``logit_bias`` (the grammar masks it once it applies): strongly for
the tool calls (the thought ends at once), moderately for the reasoning test (a few random tokens of
thought first). The tools' arguments have no free text (enums, integers, ``[a-z]`` patterns), so the raised
marker cannot land inside a call.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
import openai
import pytest
from pdserve.v1 import gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.engine.tokenizer import ChatMessage, Tokenizer, ToolCallRecord
from tests.e2e.conftest import GATEWAY_ARGS, wait_idle
from tests.engine.tiny_chat_family import build_chat_family

pytestmark = pytest.mark.slow

ENGINE_ARGS = ("--dtype", "float32", "--threads", "1", "--max-num-batched-tokens", "64")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ANSWER = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["word", "n"], "additionalProperties": False}
MAX_TOKENS = 200


def ask(what: str) -> list[dict]:
    return [{"role": "user", "content": what}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, bundled_tokenizer):
    return build_chat_family(tmp_path_factory.mktemp("chat"), bundled_tokenizer.hf)


@pytest.fixture(scope="module")
def tokenizer(chat_dir):
    return Tokenizer.load(chat_dir)


@pytest.fixture(scope="module")
def served(chat_dir):
    spec = ClusterSpec(model=str(chat_dir), cache_store=False, engine_args=ENGINE_ARGS, http_listen="127.0.0.1:0",
                       prefill_args=("--num-kv-blocks", "128"), decode_args=("--num-kv-blocks", "256"),
                       gateway_args=(*GATEWAY_ARGS, "--reasoning-parser", "qwen3"))
    with start_cluster(spec, stderr=subprocess.DEVNULL) as running, \
            grpc.insecure_channel(running.address) as channel, \
            openai.OpenAI(base_url=f"{running.http_url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client, gateway_pb2_grpc.GatewayStub(channel)


@pytest.fixture(scope="module")
def client(served):
    return served[0]


@pytest.fixture(scope="module")
def stub(served):
    return served[1]


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def end_bias(tokenizer):
    """``logit_bias`` raising ``</think>`` by ``bias``."""
    (end_id,) = tokenizer.hf.encode("</think>", add_special_tokens=False)
    return lambda bias: {str(end_id): bias}


def assert_valid_call(call, names=tuple(PARAMETERS)) -> None:
    assert call.type == "function" and call.id, call
    assert call.function.name in names, call
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_required_calls_of_a_random_model_always_validate(client, model, end_bias):
    def one(seed: int):
        return client.chat.completions.create(
            model=model, messages=ask(f"Question {seed}: the weather, or a sum?"), tools=TOOLS,
            tool_choice="required", parallel_tool_calls=seed % 2 == 0, temperature=1.0, seed=seed,
            max_tokens=MAX_TOKENS, logit_bias=end_bias(30))

    with ThreadPoolExecutor(10) as pool:
        completions = list(pool.map(one, range(10)))
    names = set()
    for seed, completion in enumerate(completions):
        (choice,) = completion.choices
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert calls and (seed % 2 == 0 or len(calls) == 1), calls
        for call in calls:
            assert_valid_call(call)
            names.add(call.function.name)
        assert len({call.id for call in calls}) == len(calls)
        assert "</think>" not in (choice.message.content or "") + (choice.message.reasoning_content or "")
    assert names == set(PARAMETERS), "temperature 1 picks either tool"


def test_a_named_tool_choice_calls_exactly_that_tool(client, model, end_bias):
    for seed in range(3):
        completion = client.chat.completions.create(
            model=model, messages=ask("Add two numbers."), tools=TOOLS, temperature=1.0, seed=seed,
            tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=MAX_TOKENS,
            logit_bias=end_bias(30))
        (choice,) = completion.choices
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert_valid_call(call, names=("add",))


def test_a_streamed_required_call_accumulates_to_a_valid_call(client, model, end_bias):
    stream = client.chat.completions.create(
        model=model, messages=ask("Weather in Oslo?"), tools=TOOLS, tool_choice="required", stream=True,
        parallel_tool_calls=False, temperature=1.0, seed=7, max_tokens=MAX_TOKENS, logit_bias=end_bias(30))
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                into = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                into["id"] += delta.id or ""
                into["name"] += delta.function.name or ""
                into["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0], calls
    call = calls[0]
    assert call["id"] and call["name"] in PARAMETERS, call
    jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])


def test_responses_give_the_reasoning_and_a_valid_forced_call_as_items(client, model, end_bias):
    """``/v1/responses`` with ``tool_choice: required``: a function call item that validates against its tool's
    schema (after a reasoning item where the model thought before ``</think>``), whole and streamed alike."""
    functions = [{"type": "function", **tool["function"]} for tool in TOOLS]
    body = {"model": model, "input": "Weather in Oslo?", "tools": functions, "tool_choice": "required",
            "parallel_tool_calls": False, "temperature": 1.0, "max_output_tokens": MAX_TOKENS,
            "extra_body": {"logit_bias": end_bias(30), "seed": 3}}
    response = client.responses.create(**body)
    with client.responses.stream(**body) as stream:
        streamed = stream.get_final_response()
    for made in (response, streamed):
        assert made.status == "completed", made
        assert [item.type for item in made.output] in (["function_call"], ["reasoning", "function_call"])
        call = made.output[-1]
        assert call.call_id and call.name in PARAMETERS
        jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])

    def shown(item):
        return (item.type, item.status, item.name, item.arguments) if item.type == "function_call" else \
            (item.type, item.status, [part.text for part in item.content])

    assert [shown(item) for item in streamed.output] == [shown(item) for item in response.output]  # seeded


def test_a_tool_result_round_trip_is_rendered_and_answered(client, model, tokenizer):
    arguments = '{"city": "oslo", "unit": "c"}'
    messages = [*ask("Weather in Oslo?"),
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    rendered = [ChatMessage("user", "Weather in Oslo?"),
                ChatMessage("assistant", "", (ToolCallRecord("call_1", "get_weather", arguments),)),
                ChatMessage("tool", "sunny, 21 C", tool_call_id="call_1")]
    for tool_choice, offered in (("none", ()), ("auto", TOOLS)):
        completion = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                    tool_choice=tool_choice, temperature=1.0, seed=3, max_tokens=12)
        (choice,) = completion.choices
        assert choice.finish_reason in ("stop", "length", "tool_calls"), choice
        if tool_choice == "none":
            assert not choice.message.tool_calls and isinstance(choice.message.content, str)
        prompt = tokenizer.apply_chat_template(rendered, tools=offered)
        assert completion.usage.prompt_tokens == len(prompt), tool_choice  # the call and result were rendered
        text = tokenizer.decode(prompt, skip_special_tokens=False)
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "oslo", "unit": "c"}}' in text
        assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text


def _raw_output(choice) -> str:
    """The output as the model wrote it, from the per-token bytes of ``logprobs``."""
    return b"".join(bytes(entry.bytes) for entry in choice.logprobs.content).decode(errors="replace")


def test_reasoning_is_split_and_the_schema_applies_after_it(client, model, end_bias):
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}

    def one(seed: int):
        return client.chat.completions.create(
            model=model, messages=ask(f"Think, then answer {seed} as JSON."), response_format=response_format,
            temperature=1.0, seed=seed, max_tokens=MAX_TOKENS, logprobs=True, logit_bias=end_bias(10))

    with ThreadPoolExecutor(8) as pool:
        completions = list(pool.map(one, range(8)))
    thoughts = 0
    for completion in completions:
        (choice,) = completion.choices
        raw = _raw_output(choice)
        message = choice.message
        assert "</think>" in raw and choice.finish_reason == "stop", (raw, choice)
        before, _, after = raw.partition("</think>")
        assert (message.reasoning_content or "").replace("\ufffd", "") == before.replace("\ufffd", "")
        assert message.content == after.lstrip("\r\n"), (message.content, after)
        jsonschema.validate(json.loads(message.content), ANSWER)
        thoughts += bool(before)
    assert thoughts > 0, "some random thought comes before the marker"

    free = client.chat.completions.create(model=model, messages=ask("Hi"), temperature=1.0, seed=1, max_tokens=16,
                                          logprobs=True, logit_bias=end_bias(-100))
    (choice,) = free.choices  # no </think>: the model did not think, all of it is content
    assert not choice.message.reasoning_content
    assert choice.message.content == _raw_output(choice) or "\ufffd" in choice.message.content


def test_with_thinking_off_in_the_template_the_schema_applies_from_the_first_token(client, model, end_bias):
    """``chat_template_kwargs: {"enable_thinking": false}`` writes ``<think>\n\n</think>\n\n`` into the
    prompt (as Qwen3's template does): no ``</think>`` comes in the output, so the constraint must apply
    from the first token. ``</think>`` is pushed down here: a constraint still waiting for it would leave
    the random model's output free, never valid JSON."""
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    completion = client.chat.completions.create(
        model=model, messages=ask("Answer as JSON."), response_format=response_format, n=4, temperature=1.0,
        seed=5, max_tokens=MAX_TOKENS, logprobs=True, logit_bias=end_bias(-100),
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    prompt_without = client.chat.completions.create(model=model, messages=ask("Answer as JSON."), max_tokens=1)
    assert completion.usage.prompt_tokens == prompt_without.usage.prompt_tokens + 4  # <think>, \n\n, </think>, \n\n
    for choice in completion.choices:
        assert choice.finish_reason == "stop" and "<think>" not in _raw_output(choice), choice
        assert not choice.message.reasoning_content
        jsonschema.validate(json.loads(choice.message.content), ANSWER)


def test_a_tool_choice_naming_an_unknown_tool_is_a_400_and_the_cluster_serves_after(client, model, stub):
    before = {n.address: n.requests_total for n in wait_idle(stub)}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=ask("Hi"), tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    error = raised.value.body
    assert error["param"] == "tool_choice" and "get_time" in error["message"], error
    nodes = wait_idle(stub)
    assert {n.address: n.requests_total for n in nodes} == before, "no node saw the refused request"
    again = client.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=3, temperature=0.0)
    assert again.choices[0].finish_reason in ("stop", "length")
    wait_idle(stub)

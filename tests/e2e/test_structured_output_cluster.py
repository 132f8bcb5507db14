"""Structured output on a real disaggregated cluster (gateway, prefill node, decode node) serving a tiny
RANDOM-weight model: nothing but the grammar can make its output valid. With temperature 1, every output
validates against its JSON schema (and matches its regex, choice or grammar); greedy float32 constrained
outputs equal the mixed engine's token for token; bad specs are refused with INVALID_ARGUMENT naming the
problem before any node works, and the cluster is idle and serving afterwards.

The schemas bound every string, integer and array, so each answer closes well within ``MAX_TOKENS`` and the
request ends with ``stop`` (EOS is allowed only where the grammar accepts). The cases here are shared with
the preemption and handover modules (``test_structured_output_pressure.py``, ``..._handover.py``)."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.engine.structured_spec import MAX_SPEC_CHARS
from tests.e2e.conftest import GATEWAY_ARGS, generate, model_nodes, wait_idle

pytestmark = pytest.mark.slow

FAMILY = "qwen2"
TINY_ENGINE_ARGS = ("--dtype", "float32", "--threads", "1", "--max-num-batched-tokens", "64")
MAX_TOKENS = 400

_ITEM = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 999}},
         "required": ["name", "n"]}
SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {
        "kind": {"enum": ["x", "y"]},
        "point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -50, "maximum": 50},
                                                   "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["x", "y"], "additionalProperties": False},
        "note": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]},
        "code": {"type": "string", "pattern": "^[a-z]{2,5}$"}},
     "required": ["kind", "point", "note", "code"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0,
                                                                        "maximum": 9},
                                                                 "v": {"const": "k"}},
                                "required": ["id", "v"], "additionalProperties": False},
     "minItems": 1, "maxItems": 4},
    {"$defs": {"p": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                     "required": ["n"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#/$defs/p"}},
     "required": ["a", "b"], "additionalProperties": False},
]
# long answers (5-6 items of ~15 tokens each): what puts a small decode pool under pressure
LONG_SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": _ITEM, "minItems": 5,
                                                          "maxItems": 6}},
               "required": ["items"], "additionalProperties": False}
REGEX = r"[a-z]{3,8}-[0-9]{2}"
CHOICES = ["red", "green", "blue", "light blue"]
GRAMMAR = 'start: greeting " " name "!"\ngreeting: "hello" | "hi"\nname: /[A-Z][a-z]{1,6}/'


def prompts(n: int) -> list[list[int]]:
    """Token ids 5..49005 (any will do for a random model), 10 to 30 tokens."""
    return [[(i * 37 + j * 11) % 49000 + 5 for j in range(10 + (i * 7) % 21)] for i in range(n)]


def schema_output(schema: dict) -> gateway_pb2.StructuredOutput:
    return gateway_pb2.StructuredOutput(json_schema=json.dumps(schema))


def sampled(structured: gateway_pb2.StructuredOutput, seed: int, temperature: float = 1.0,
            max_tokens: int = MAX_TOKENS) -> gateway_pb2.SamplingParams:
    return gateway_pb2.SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed,
                                      structured=structured)


def run_schemas(stub, cases: list[tuple[dict, list[int], int]], timeout: float = 300,
                max_tokens: int = MAX_TOKENS) -> list[str]:
    """Run ``(schema, prompt ids, seed)`` cases concurrently at temperature 1; each answer ends with
    ``stop`` and validates against its schema. Returns the texts."""
    def one(case: tuple[dict, list[int], int]) -> str:
        schema, ids, seed = case
        sampling = sampled(schema_output(schema), seed, max_tokens=max_tokens)
        _, text, last = generate(stub, timeout=timeout, token_ids=ids, sampling=sampling)
        assert last.finish_reason == "stop", (last.finish_reason, text)
        jsonschema.validate(json.loads(text), schema)
        return text

    with ThreadPoolExecutor(len(cases)) as pool:
        return list(pool.map(one, cases))


def tiny_spec(path, **overrides) -> ClusterSpec:
    values = dict(model=str(path), cache_store=False, engine_args=TINY_ENGINE_ARGS,
                  prefill_args=("--num-kv-blocks", "128"), decode_args=("--num-kv-blocks", "256"),
                  gateway_args=GATEWAY_ARGS)
    values.update(overrides)
    return ClusterSpec(**values)


@pytest.fixture(scope="module")
def tiny(family_dir):
    return family_dir(FAMILY)


@pytest.fixture(scope="module")
def served(tiny):
    with start_cluster(tiny_spec(tiny), stderr=subprocess.DEVNULL) as running, \
            grpc.insecure_channel(running.address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


def test_every_json_schema_output_of_a_random_model_validates_across_the_cluster(served):
    cases = [(schema, ids, seed) for seed, (schema, ids) in
             enumerate(zip([*SCHEMAS, *SCHEMAS, LONG_SCHEMA], prompts(2 * len(SCHEMAS) + 1), strict=True))]
    texts = run_schemas(served, cases)
    assert len(set(texts)) > len(SCHEMAS), "temperature 1 gives different answers"
    _, free, _ = generate(served, token_ids=prompts(1)[0], sampling=gateway_pb2.SamplingParams(
        max_tokens=40, temperature=1.0, seed=1))
    with pytest.raises(ValueError):
        json.loads(free)  # without the grammar the model writes no JSON


def test_json_object_regex_choice_and_grammar_outputs_hold(served):
    kinds = [(gateway_pb2.StructuredOutput(json_object=True), lambda t: isinstance(json.loads(t), dict)),
             (gateway_pb2.StructuredOutput(regex=REGEX), lambda t: re.fullmatch(REGEX, t) is not None),
             (gateway_pb2.StructuredOutput(choice=gateway_pb2.StructuredChoice(choices=CHOICES)),
              lambda t: t in CHOICES),
             (gateway_pb2.StructuredOutput(grammar=GRAMMAR),
              lambda t: re.fullmatch(r"(hello|hi) [A-Z][a-z]{1,6}!", t) is not None)]
    for k, (structured, holds) in enumerate(kinds):
        for seed, ids in enumerate(prompts(3)):
            max_tokens = 60 if k == 0 else MAX_TOKENS  # json_object is unbounded: a cut answer is not checked
            _, text, last = generate(served, token_ids=ids, sampling=sampled(structured, seed, max_tokens=max_tokens))
            if last.finish_reason == "stop" or k != 0:
                assert last.finish_reason == "stop" and holds(text), (structured, text)
            else:
                assert text.startswith("{"), text


def test_greedy_constrained_outputs_equal_the_mixed_engines(served, tiny):
    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine
    from services.engine.sampling_params import SamplingParams
    from services.engine.structured_spec import StructuredSpec

    mixed = LLMEngine.from_config(EngineConfig(model_path=str(tiny), dtype="float32", num_kv_blocks=256,
                                               max_num_batched_tokens=64))
    ids = prompts(len(SCHEMAS))
    for schema, prompt in zip(SCHEMAS, ids, strict=True):
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                structured=StructuredSpec("json_schema", json.dumps(schema)))
        want = mixed.generate([prompt], params)[0]
        tokens, text, last = generate(served, token_ids=prompt, sampling=sampled(schema_output(schema), 0, 0.0))
        jsonschema.validate(json.loads(text), schema)
        assert last.finish_reason == want.finish_reason == "stop"
        assert tokens == list(want.token_ids), (tokens, want.token_ids)


BAD = [
    (gateway_pb2.StructuredOutput(json_schema='{"type": "object", "properties": {"a": {"type": "integre"}}}'),
     "JSON schema"),
    (gateway_pb2.StructuredOutput(json_schema="{not json"), "structured_output"),
    (gateway_pb2.StructuredOutput(regex="(a"), "regex"),
    (gateway_pb2.StructuredOutput(grammar="start: undefined_rule"), "grammar"),
    (gateway_pb2.StructuredOutput(regex="a" * (MAX_SPEC_CHARS + 1)), "over the limit"),
    (gateway_pb2.StructuredOutput(), "kind must be one of"),
]


def test_bad_specs_are_refused_before_any_node_works_and_the_cluster_serves_after(served):
    before = {n.address: n.requests_total for n in wait_idle(served)}
    for structured, problem in BAD:
        with pytest.raises(grpc.RpcError) as error:
            generate(served, token_ids=prompts(1)[0], sampling=sampled(structured, 1))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
        assert "structured_output" in error.value.details() and problem in error.value.details(), \
            error.value.details()
    nodes = wait_idle(served)
    assert {n.address: n.requests_total for n in nodes} == before, "no node saw a refused request"
    tokens, _, last = generate(served, token_ids=prompts(1)[0],
                               sampling=gateway_pb2.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(tokens) == 8 and last.finish_reason == "length"
    assert all(n.healthy for n in model_nodes(served))
    wait_idle(served)

"""Constrained decoding (issue 26): a random-weight model, whose free output is never valid JSON, gives only
valid outputs under a grammar — mixed, preempted and recomputed, preempted and resumed from host memory,
prefilled on one engine and decoded on another, handed over mid-decode — and greedy constrained outputs
are the same on every path. Bad specs are refused naming the problem, and nothing failed stays cached."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest

from services.engine.admission import AdmissionConfig
from services.engine.config import EngineConfig
from services.engine.engine import LLMEngine
from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams
from services.engine.structured_spec import StructuredSpec
from services.engine_node.remote_store import BreakerRemoteStore
from tests.engine.test_disaggregated_handoff import _run_disaggregated
from tests.engine.test_handover_adoption import FakeStore, _hand_over, _run, _step_until_due

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]}},
    "required": ["name", "age", "tags", "pet"],
    "$defs": {"pet": {"type": "object", "required": ["kind"], "properties": {
        "kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 1, "maximum": 9}}}}}
LONG = {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 20, "maxItems": 20}  # ~80 tokens
REGEX = r"[a-z]{2,6}-[0-9]{1,3}"
CHOICES = ("yes", "no", "maybe \"not\"", "ça 😀")
LARK = 'start: greeting " " name ("," " " name){0,2} "!"\ngreeting: "hello" | "hi"\nname: /[a-z]{1,8}/'
LARK_AS_REGEX = r"(hello|hi) [a-z]{1,8}(, [a-z]{1,8}){0,2}!"
NONE = AdmissionConfig(policy="none")

SPECS = {
    "schema": StructuredSpec("json_schema", json.dumps(SCHEMA)),
    "long": StructuredSpec("json_schema", json.dumps(LONG)),
    "regex": StructuredSpec("regex", REGEX),
    "choice": StructuredSpec("choice", choices=CHOICES),
    "grammar": StructuredSpec("grammar", LARK),
}


def _valid(kind: str, text: str) -> bool:
    if kind in ("schema", "long"):
        jsonschema.validate(json.loads(text), SCHEMA if kind == "schema" else LONG)
        return True
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    if kind == "choice":
        return text in CHOICES
    return re.fullmatch(LARK_AS_REGEX, text) is not None


@pytest.fixture(scope="module")
def tiny(family_dir):
    return family_dir("llama3")


def _engine(path, **overrides) -> LLMEngine:
    settings = dict(model_path=str(path), dtype="float32", num_kv_blocks=256, max_num_batched_tokens=64)
    return LLMEngine.from_config(EngineConfig(**(settings | overrides)))


def _workload(engine, n: int = 20, **params):
    names = [list(SPECS)[i % len(SPECS)] for i in range(n)]
    prompts = [engine.tokenizer.encode(f"Request {i}: tell me something") for i in range(n)]
    sampling = [SamplingParams(max_tokens=120, seed=i, structured=SPECS[name], **params)
                for i, name in enumerate(names)]
    return names, prompts, sampling


RANDOM = dict(temperature=1.3, top_p=0.95, top_k=500, min_p=0.0, repetition_penalty=1.2, ignore_eos=True)


@pytest.mark.parametrize("path_kind", ["mixed", pytest.param("recomputed", marks=pytest.mark.slow),
                                       pytest.param("offloaded", marks=pytest.mark.slow)])
def test_random_model_outputs_are_always_valid(tiny, path_kind):
    small = dict(num_kv_blocks=12, admission=NONE)
    engine = _engine(tiny, **{"mixed": {}, "recomputed": small | {"offload_host_gib": 0},
                              "offloaded": small}[path_kind])
    names, prompts, sampling = _workload(engine, **RANDOM)
    results = engine.generate(prompts, sampling)
    for name, result in zip(names, results, strict=True):
        assert result.finish_reason == "stop", (name, result.text)
        assert _valid(name, result.text), (name, result.text)
    stats = engine.scheduler.stats
    if path_kind == "mixed":
        assert stats.preemptions_total == 0
    else:
        assert stats.preemptions_total > 0
        assert (stats.recomputes_total if path_kind == "recomputed" else stats.resumes_total) > 0
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_unconstrained_random_output_is_not_json(tiny):
    """The control: without the grammar the same model gives nothing the checks accept."""
    engine = _engine(tiny)
    names, prompts, sampling = _workload(engine, n=5, **RANDOM)
    free = [SamplingParams(**{**p.__dict__, "structured": None, "max_tokens": 40}) for p in sampling]
    for name, result in zip(names, engine.generate(prompts, free), strict=True):
        with pytest.raises((ValueError, AssertionError, jsonschema.ValidationError)):
            assert _valid(name, result.text)


def test_json_object_outputs_parse_as_objects_and_logit_bias_cannot_break_the_grammar(tiny):
    engine = _engine(tiny)
    quote = engine.tokenizer.encode("hello")[0]  # never allowed first: an object starts with "{"
    sampling = [SamplingParams(max_tokens=150, temperature=1.0, seed=i, structured=StructuredSpec("json_object"),
                               logit_bias=((quote, 100.0),)) for i in range(6)]
    results = engine.generate([engine.tokenizer.encode("An object:")] * 6, sampling)
    stopped = [r for r in results if r.finish_reason == "stop"]
    assert stopped, [r.text for r in results]
    for result in stopped:
        assert isinstance(json.loads(result.text), dict), result.text
    for result in results:  # cut by max_tokens or not, every token was the grammar's
        assert result.token_ids[0] != quote
        engine.check_structured(StructuredSpec("json_object"), result.token_ids, "output")


def test_the_grammar_ends_a_request_even_with_ignore_eos_and_min_tokens(tiny):
    engine = _engine(tiny)
    spec = StructuredSpec("choice", choices=("yes", "no"))
    result = engine.generate([engine.tokenizer.encode("Yes or no?")],
                             SamplingParams(max_tokens=50, min_tokens=20, ignore_eos=True, temperature=0.8,
                                            seed=3, structured=spec))[0]
    assert result.text in ("yes", "no") and result.finish_reason == "stop"


def test_greedy_constrained_outputs_match_across_mixed_and_disaggregated(tiny):
    sampling = SamplingParams(max_tokens=100, temperature=0.0, structured=SPECS["schema"])
    mixed = _engine(tiny)
    prompts = {f"r{i}": mixed.tokenizer.encode(f"Person {i}:") for i in range(3)}
    expected = {rid: r.token_ids for rid, r in zip(prompts, mixed.generate(list(prompts.values()), sampling),
                                                    strict=True)}
    prefill, decode = _engine(tiny), _engine(tiny)
    handed = _run_disaggregated(prefill, decode, prompts, sampling)
    assert {rid: r.output_token_ids for rid, r in handed.items()} == expected
    for request in handed.values():
        assert request.finish_reason == "stop"
        jsonschema.validate(json.loads(decode.tokenizer.decode(request.output_token_ids)), SCHEMA)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [None, 7])
def test_constrained_requests_handed_over_mid_decode_continue_exactly(tiny, seed):
    """Engine A's pool holds one request's JSON, not two: the newest is preempted, its KV goes to a (fake)
    cache-store, engine B adopts it and rebuilds its grammar from the tokens so far."""
    sampling = SamplingParams(max_tokens=80, temperature=0.0 if seed is None else 1.0, seed=seed,
                              structured=SPECS["long"])
    mixed = _engine(tiny)
    prompts = [mixed.tokenizer.encode(f"Request {i}: a list of twenty letters, please") for i in range(2)]
    expected = [r.token_ids for r in mixed.generate(prompts, sampling)]
    store = FakeStore()
    config = EngineConfig(model_path=str(tiny), dtype="float32", num_kv_blocks=6, max_num_batched_tokens=64,
                          admission=NONE, offload_cache_store="127.0.0.1:1", offload_remote="always")
    a = LLMEngine(config, mixed.model, mixed.tokenizer, remote_store=lambda address, layout: BreakerRemoteStore(store))
    b = _engine(tiny, num_kv_blocks=32)
    requests = [a.add_request(sampling=sampling, token_ids=p, request_id=f"r{i}") for i, p in enumerate(prompts)]
    moved = _step_until_due(a)
    handed, adopted = _hand_over(a, b, store, moved)
    assert 1 <= len(handed.output_token_ids) < len(expected[int(moved[1:])]), "handed over mid-decode"
    _run(a)
    _run(b)
    outputs = {r.request_id: r.output_token_ids for r in requests if r.request_id != moved}
    outputs[moved] = adopted.output_token_ids
    assert [outputs["r0"], outputs["r1"]] == expected
    assert adopted.finish_reason == "stop"
    jsonschema.validate(json.loads(b.tokenizer.decode(adopted.output_token_ids)), LONG)
    refused = (*handed.output_token_ids[:-1], b.tokenizer.encode("hello")[0])  # a peer's bad tokens
    with pytest.raises(InvalidRequestError, match="output_token_ids"):
        b.adopt(dataclasses.replace(handed, request_id="again", output_token_ids=refused), 30.0)


def test_a_commit_or_adoption_with_tokens_the_grammar_refuses_is_refused(tiny):
    decode = _engine(tiny)
    spec = StructuredSpec("choice", choices=("yes", "no"))
    sampling = SamplingParams(max_tokens=5, structured=spec)
    bad = decode.tokenizer.encode("maybe")[0]
    with pytest.raises(InvalidRequestError, match="first_token_id"):
        decode.check_structured(spec, [bad], "commit.first_token_id")
    ids = decode.tokenizer.encode("Yes or no?")
    decode.reserve("r", ids, sampling, 30.0)
    with pytest.raises(InvalidRequestError, match=r"commit\.first_token_id"):
        decode.commit("r", bad)


BAD = [
    (StructuredSpec("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "foo"}}})),
     "#/properties/a.*Invalid type: foo"),
    (StructuredSpec("json_schema", json.dumps({"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "string", "pattern": "(("}}}})), "#/properties/a/items.*regex"),
    (StructuredSpec("json_schema", json.dumps({"$defs": {"x": {"type": "bar"}}, "$ref": "#/$defs/x"})),
     "#/\\$defs/x"),
    (StructuredSpec("json_schema", json.dumps({"$ref": "#/$defs/missing"})), "missing"),
    (StructuredSpec("json_schema", "{not json"), "not valid JSON"),
    (StructuredSpec("json_schema", "[1, 2]"), "must be a JSON object"),
    (StructuredSpec("json_schema", json.dumps({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]})),
     "oneOf"),
    (StructuredSpec("regex", "a(b"), "(?s)invalid regex.*unclosed group"),
    (StructuredSpec("grammar", "start: undefined_rule"), "invalid grammar.*unknown name"),
    (StructuredSpec("xml", "<a/>"), "kind must be one of"),
    (StructuredSpec("choice"), "at least one"),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_bad_specs_are_refused_naming_the_problem_and_not_cached(tiny, spec, message):
    engine = _engine(tiny)
    sampling = SamplingParams(max_tokens=8, structured=spec)
    for _attempt in range(2):  # the second time is refused the same way: nothing half-built was cached
        with pytest.raises(InvalidRequestError, match=message) as info:
            engine.add_request("hi", sampling)
        assert info.value.field == "structured_output"
        assert not engine.structured.cached(spec)
    with pytest.raises(InvalidRequestError, match=message):
        engine.reserve("r", engine.tokenizer.encode("hi"), sampling, 30.0)
    assert not engine.has_unfinished() and not engine.reservations.reservations
    good = engine.generate(["hi"], SamplingParams(max_tokens=8, structured=SPECS["regex"]))[0]
    assert re.fullmatch(REGEX, good.text)  # still serving


def test_compiled_grammars_are_cached_by_spec(tiny):
    engine = _engine(tiny)
    first = engine.structured.compile(SPECS["schema"])
    again = StructuredSpec("json_schema", json.dumps(SCHEMA))
    assert engine.structured.compile(again) is first
    small = type(engine.structured)(engine.tokenizer, engine.model.config.vocab_size, cache_size=2)
    for kind in ("regex", "choice", "grammar"):
        small.compile(SPECS[kind])
    assert not small.cached(SPECS["regex"]) and small.cached(SPECS["grammar"])


@pytest.mark.slow
def test_the_bundled_model_writes_schema_valid_json(fp32_model, bundled_tokenizer):
    from tests.conftest import make_engine

    engine = make_engine(fp32_model, bundled_tokenizer)
    sampling = [SamplingParams(max_tokens=120, temperature=t, seed=i, structured=SPECS["schema"])
                for i, t in enumerate((0.0, 0.7, 1.0))]
    prompt = "Describe a person as JSON with their name, age, favourite colours and pet:"
    for result in engine.generate([bundled_tokenizer.encode(prompt)] * 3, sampling):
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), SCHEMA)


def test_a_grammar_that_cannot_go_on_aborts_its_request_saying_why(tiny, monkeypatch):
    """The engine's own abort names the grammar's error (the decode node passes it to the gateway, whose
    client error then says more than 'no reason given')."""
    from services.engine.structured.matcher import RequestGrammar

    engine = _engine(tiny)
    engine.add_request(sampling=SamplingParams(max_tokens=20, structured=SPECS["regex"]), token_ids=[5, 6, 7],
                       request_id="r")
    monkeypatch.setattr(RequestGrammar, "advance", lambda self, token: False)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    (aborted,) = [o for o in outputs if o.finish_reason == "abort"]
    assert aborted.abort_reason.startswith("structured output: the grammar refused the sampled token")
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks

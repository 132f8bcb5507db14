"""The gateway checks a structured-output spec before any node works: its shape (validation) and its
content (compiled by a compiler, off the event loop, bounded in time; only specs that compiled are
remembered). A valid spec reaches the prefill node in ``PrefillRequest.sampling``."""

from __future__ import annotations

import asyncio
import json
import threading

import grpc
import pytest
from pdserve.v1 import gateway_pb2

from services.common.errors import UnavailableError
from services.common.sampling_convert import structured_from_proto
from services.engine.errors import InvalidRequestError
from services.engine.structured_spec import MAX_SPEC_CHARS, StructuredSpec
from services.gateway.structured_check import StructuredChecks
from tests.gateway.test_generate import failure, request, script_tokens

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


class FakeCompiler:
    """Refuses a spec whose text or choices contain "bad"; records the thread of each check; blocks on
    ``release`` while it is set up to."""

    def __init__(self) -> None:
        self.checked: list[StructuredSpec] = []
        self.threads: list[threading.Thread] = []
        self.release: threading.Event | None = None

    def check(self, spec: StructuredSpec) -> None:
        self.checked.append(spec)
        self.threads.append(threading.current_thread())
        if self.release is not None:
            self.release.wait(10)
        if "bad" in spec.text or any("bad" in c for c in spec.choices):
            raise InvalidRequestError("structured_output", f"{spec.kind} does not compile: bad")


@pytest.fixture
def compiler(cluster) -> FakeCompiler:
    fake = FakeCompiler()
    cluster.gateway.core.structured = StructuredChecks(lambda: fake)
    return fake


def constrained(**kind) -> gateway_pb2.GenerateRequest:
    message = request(max_tokens=4)
    message.sampling.structured.CopyFrom(gateway_pb2.StructuredOutput(**kind))
    return message


@pytest.mark.parametrize("kind", [{"json_schema": '{"type": "bad"}'}, {"regex": "bad("}, {"grammar": "start: bad"},
                                  {"choice": gateway_pb2.StructuredChoice(choices=["ok", "bad"])}])
async def test_a_spec_that_does_not_compile_is_refused_before_any_node_works(cluster, compiler, kind):
    error = await failure(cluster, constrained(**kind))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "structured_output" in error.details() and "does not compile: bad" in error.details()
    assert cluster.p.requests == [] and cluster.d.attaches == []
    assert len(compiler.checked) == 1


@pytest.mark.parametrize(("kind", "problem"), [
    ({}, "kind must be one of"),
    ({"regex": "a" * (MAX_SPEC_CHARS + 1)}, "over the limit"),
    ({"choice": gateway_pb2.StructuredChoice()}, "at least one"),
])
async def test_a_spec_of_the_wrong_shape_is_refused_without_compiling(cluster, compiler, kind, problem):
    error = await failure(cluster, constrained(**kind))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "structured_output" in error.details() and problem in error.details()
    assert compiler.checked == [] and cluster.p.requests == []


async def test_a_valid_spec_reaches_the_prefill_node_compiled_once_off_the_loop(cluster, compiler, tokenizer):
    for _ in range(2):
        script_tokens(cluster, tokenizer)
        [r async for r in cluster.stub.Generate(constrained(json_schema=SCHEMA), timeout=5)]
    assert [structured_from_proto(r.sampling.structured) for r in cluster.p.requests] == \
        [StructuredSpec("json_schema", SCHEMA)] * 2
    assert len(compiler.checked) == 1, "the second request's spec was known"
    assert compiler.threads[0] is not threading.main_thread()


async def test_a_refused_spec_is_not_remembered(cluster, compiler):
    for _ in range(2):
        assert (await failure(cluster, constrained(regex="bad"))).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(compiler.checked) == 2


async def test_an_unconstrained_request_compiles_nothing(cluster, compiler, tokenizer):
    script_tokens(cluster, tokenizer)
    [r async for r in cluster.stub.Generate(request(max_tokens=4), timeout=5)]
    assert compiler.checked == [] and len(cluster.p.requests) == 1


async def test_a_compile_past_its_time_limit_refuses_the_request_and_one_waiting_too_long_is_unavailable():
    fake = FakeCompiler()
    fake.release = threading.Event()
    checks = StructuredChecks(lambda: fake, workers=1, compile_timeout_s=0.2, queue_timeout_s=0.1)
    try:
        slow = asyncio.ensure_future(checks.check(StructuredSpec("regex", "a+")))
        queued = asyncio.ensure_future(checks.check(StructuredSpec("regex", "b+")))
        with pytest.raises(UnavailableError, match="busy compiling"):
            await queued
        with pytest.raises(InvalidRequestError, match=r"structured_output: compiling it took over 0\.2s"):
            await slow
    finally:
        fake.release.set()
        checks.close()
    assert [s.text for s in fake.checked] == ["a+"], "the queued check never ran"
    await asyncio.sleep(0.05)
    fake.release = None
    checks = StructuredChecks(lambda: fake)
    await checks.check(StructuredSpec("regex", "a+"))  # not remembered as valid from the late compile
    assert checks.compiles == 1
    checks.close()


@pytest.mark.parametrize(("kind", "text"), [("json_schema", '{"type": "integer", "minimum": "x"}'),
                                            ("json_schema", "{not json"), ("regex", "(a"),
                                            ("grammar", "start: undefined_rule")])
async def test_the_engine_compiler_refuses_bad_specs_naming_the_field(tokenizer, model_config, kind, text):
    pytest.importorskip("services.engine.structured.compiler")
    from services.gateway.structured_check import engine_compiler

    checks = StructuredChecks(lambda: engine_compiler(tokenizer, model_config.vocab_size))
    try:
        with pytest.raises(InvalidRequestError) as error:
            await checks.check(StructuredSpec(kind, text))
        assert error.value.field.startswith("structured_output"), error.value
        await checks.check(StructuredSpec("json_schema", SCHEMA))
    finally:
        checks.close()


async def test_a_compiler_that_cannot_be_built_fails_the_check_at_once():
    def broken():
        raise RuntimeError("no grammar library")

    checks = StructuredChecks(broken, queue_timeout_s=30)
    try:
        with pytest.raises(RuntimeError, match="no grammar library"):
            await asyncio.wait_for(checks.check(StructuredSpec("regex", "a")), 5)
    finally:
        checks.close()


@pytest.mark.parametrize("after", [(), (7,), (200005, 17196, 200008)])
def test_the_marker_tokens_cross_the_wire_and_a_single_one_also_as_earlier_versions_read_it(after):
    from services.common.sampling_convert import structured_to_proto

    message = structured_to_proto(StructuredSpec("regex", "[0-9]+", starts_after_token_ids=after))
    assert structured_from_proto(message).starts_after_token_ids == after
    assert message.HasField("starts_after_token_id") is (len(after) == 1)  # what an earlier node reads
    earlier = gateway_pb2.StructuredOutput(regex="[0-9]+", starts_after_token_id=9)  # an earlier gateway's
    assert structured_from_proto(earlier).starts_after_token_ids == (9,)

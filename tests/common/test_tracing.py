"""Tracing setup from OTEL_* variables, off mode (nothing recorded, nothing sent), and log lines bound to
request_id and the trace id."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from services.common import tracing
from services.common.logging import setup_logging


@pytest.fixture
def log_lines():
    """JSON log lines written while the test runs (structlog and stdlib logging restored after: the root logger's
    handlers, pytest's own among them, are detached first, so that setup_logging's basicConfig(force=True) does not
    close them, and put back with the root's level)."""
    stream, root = io.StringIO(), logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers.clear()
    setup_logging("debug", "json", stream)
    structlog.contextvars.clear_contextvars()
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


@pytest.mark.parametrize("setting", [None, "", "none", " None "])
def test_tracing_is_off_unless_an_exporter_is_named(setting):
    environ = {} if setting is None else {"OTEL_TRACES_EXPORTER": setting}
    assert tracing.setup_tracing("pdserve-test", environ=environ) is False
    assert not tracing.enabled()
    assert tracing.current_context() is None
    assert tracing.outgoing() is None  # no traceparent on any call
    with tracing.span("anything", request_id="r") as span:
        assert not span.is_recording()
    assert not tracing.start_span("prefill_chunk", None, 1).is_recording()
    with tracing.server_span("Prefill", (("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),),
                             root=True) as span:
        assert not span.is_recording()  # not even with a caller's trace context


def test_an_unknown_exporter_is_a_configuration_error():
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        tracing.setup_tracing("pdserve-test", environ={"OTEL_TRACES_EXPORTER": "zipkin-ish"})
    assert not tracing.enabled()


def test_otlp_and_console_exporters_are_installed_and_shut_down():
    for name in ("otlp", "console", "otlp,console"):
        assert tracing.setup_tracing("pdserve-test", environ={"OTEL_TRACES_EXPORTER": name})
        assert tracing.enabled()
        tracing.shutdown_tracing()  # nothing recorded: returns at once, no collector needed
        assert not tracing.enabled()


@pytest.mark.parametrize(("variables", "module"), [
    ({}, "grpc"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "http"),
])
def test_the_otlp_protocol_is_the_one_the_standard_variables_name(variables, module):
    (exporter,) = tracing._exporters("otlp", variables)
    assert type(exporter).__module__ == f"opentelemetry.exporter.otlp.proto.{module}.trace_exporter"
    exporter.shutdown()


def test_an_unknown_otlp_protocol_is_a_configuration_error():
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL.*http/json"):
        tracing.setup_tracing("pdserve-test", environ={"OTEL_TRACES_EXPORTER": "otlp",
                                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert not tracing.enabled()


def test_service_name_defaults_to_ours_and_otel_service_name_wins(monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    default, named = InMemorySpanExporter(), InMemorySpanExporter()  # a shut-down exporter takes no spans
    tracing.setup_tracing("pdserve-gateway", exporter=default)
    try:
        with tracing.server_span("Generate", None, root=True):
            pass
        monkeypatch.setenv("OTEL_SERVICE_NAME", "edge-gateway")
        tracing.setup_tracing("pdserve-gateway", exporter=named)
        with tracing.server_span("Generate", None, root=True):
            pass
    finally:
        tracing.shutdown_tracing()
    (first,), (second,) = default.get_finished_spans(), named.get_finished_spans()
    assert first.resource.attributes["service.name"] == "pdserve-gateway"
    assert first.resource.attributes["deployment.environment"] == "test"
    assert second.resource.attributes["service.name"] == "edge-gateway"


def test_internal_spans_continue_a_trace_and_never_start_one(spans):
    with tracing.server_span("Prefill", None) as span:  # no caller context, not a root
        assert not span.is_recording()
        with tracing.span("reserve") as child:
            assert not child.is_recording()
    caller = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    with tracing.server_span("Prefill", (("traceparent", caller),), request_id="req-1") as server:
        with tracing.span("reserve", candidates=2):
            pass
        failed = tracing.start_span("kv_transfer", tracing.current_context(), decode_node="d:1")
        tracing.end(failed, "not committed", bytes=10)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {"Prefill", "reserve", "kv_transfer"}
    prefill = by_name["Prefill"]
    assert prefill.kind is SpanKind.SERVER
    assert format(prefill.context.trace_id, "032x") == "ab" * 16
    assert format(prefill.parent.span_id, "016x") == "cd" * 8
    assert prefill.attributes["pdserve.request_id"] == "req-1"
    assert by_name["reserve"].parent.span_id == server.get_span_context().span_id
    assert by_name["reserve"].attributes["pdserve.candidates"] == 2
    transfer = by_name["kv_transfer"]
    assert transfer.parent.span_id == server.get_span_context().span_id
    assert transfer.status.status_code is StatusCode.ERROR
    assert transfer.attributes["pdserve.bytes"] == 10 and transfer.attributes["pdserve.decode_node"] == "d:1"


def test_an_exception_marks_the_span_failed(spans):
    with pytest.raises(RuntimeError), tracing.server_span("Generate", None, root=True):
        raise RuntimeError("boom")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR


def test_log_lines_carry_request_id_and_trace_id(spans, log_lines):
    log = structlog.get_logger("test")
    with tracing.server_span("Generate", None, root=True) as span:
        tracing.bind_request("req-7")
        log.info("inside")
    log.info("after")  # the request id stays bound to the task; no span is current any more
    inside, after = log_lines()
    assert inside["request_id"] == "req-7"
    assert inside["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert inside["span_id"] == format(span.get_span_context().span_id, "016x")
    assert after["request_id"] == "req-7" and "trace_id" not in after


def test_with_tracing_off_log_lines_still_carry_request_id(log_lines):
    tracing.shutdown_tracing()
    with tracing.server_span("Prefill", None, request_id="req-9"):
        structlog.get_logger("test").warning("refused")
    (line,) = log_lines()
    assert line["request_id"] == "req-9" and line["level"] == "warning" and "trace_id" not in line

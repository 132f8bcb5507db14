"""Spans the engine thread records for a traced request: ``queue`` once, one ``prefill_chunk`` per chunk,
one ``decode`` from its first decode step to its finish; untraced requests and tracing off record none."""

from __future__ import annotations

from opentelemetry.trace import StatusCode

from services.common import tracing
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine.step_batch import ScheduledRequest
from services.engine_node.step_spans import end_request, record_step, trace_request


def _request(request_id: str, prompt_len: int) -> Request:
    return Request(request_id, list(range(prompt_len)), SamplingParams(max_tokens=4))


def test_chunks_queue_and_decode_spans_hang_under_the_given_parent(spans):
    request, untraced = _request("r1", 40), _request("r2", 40)
    with tracing.tracer().start_as_current_span("Prefill") as parent:
        trace_request(request, tracing.current_context(), queued=True)
    queued_ns = request.trace.queued_ns
    record_step([ScheduledRequest(request, 16, 0), ScheduledRequest(untraced, 16, 0)], queued_ns + 10, queued_ns + 20)
    record_step([ScheduledRequest(request, 24, 16)], queued_ns + 30, queued_ns + 40)
    request.append_output(7)
    record_step([ScheduledRequest(request, 1, 40)], queued_ns + 50, queued_ns + 60)  # first decode step
    record_step([ScheduledRequest(request, 1, 41)], queued_ns + 70, queued_ns + 80)
    assert [s.name for s in spans.get_finished_spans()].count("decode") == 0  # still open
    request.append_output(8)
    request.status = RequestStatus.FINISHED_LENGTH
    end_request(request)
    end_request(request)  # idempotent

    finished = [s for s in spans.get_finished_spans() if s.name != "Prefill"]
    assert [s.name for s in finished] == ["queue", "prefill_chunk", "prefill_chunk", "decode"]
    for span in finished:
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.attributes["pdserve.request_id"] == "r1"
    queue, first, second, decode = finished
    assert (queue.start_time, queue.end_time) == (queued_ns, queued_ns + 10)
    chunks = [(c.attributes["pdserve.chunk_index"], c.attributes["pdserve.tokens"], c.start_time - queued_ns,
               c.end_time - queued_ns) for c in (first, second)]
    assert chunks == [(0, 16, 10, 20), (1, 24, 30, 40)]
    assert decode.start_time == queued_ns + 50 and decode.end_time > queued_ns + 80
    assert decode.attributes["pdserve.output_tokens"] == 2
    assert decode.attributes["pdserve.finish_reason"] == "length"
    assert decode.status.status_code is not StatusCode.ERROR


def test_an_aborted_decode_ends_failed_and_a_decode_node_has_no_queue_span(spans):
    request = _request("r3", 8)
    with tracing.tracer().start_as_current_span("Attach"):
        trace_request(request, tracing.current_context())  # decode node: not queued here
    request.append_output(1)
    record_step([ScheduledRequest(request, 1, 8)], 100, 200)
    request.status = RequestStatus.FINISHED_ABORTED
    end_request(request)
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["Attach", "decode"]
    assert spans.get_finished_spans()[1].status.status_code is StatusCode.ERROR


def test_with_tracing_off_requests_get_no_trace():
    tracing.shutdown_tracing()
    request = _request("r4", 8)
    trace_request(request, tracing.current_context(), queued=True)
    assert request.trace is None

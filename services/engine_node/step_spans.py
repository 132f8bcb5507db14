"""Spans of the work the engine thread does for a traced request: ``queue``, ``prefill_chunk``, ``decode``.

A node that wants them sets ``request.trace = RequestTrace(parent)`` (``parent``: the OTel context of the
request's server span, captured on the event loop) under the engine lock. The engine thread cannot use
"current span" context, so every span here is created with its parent given explicitly and its times
taken from the step:

- ``queue``: from ``RequestTrace.queued_ns`` (set when the request entered the engine's queue) to the
  start of the step that runs its first chunk; only when ``queued_ns`` is set (the prefill node).
- ``prefill_chunk``: one per scheduled chunk of prompt tokens, the step's start to the model's end;
  attributes ``pdserve.chunk_index``, ``pdserve.tokens``, ``pdserve.start_token``.
- ``decode``: from the start of the request's first decode step to its finish (``end_request``);
  attributes ``pdserve.output_tokens`` and ``pdserve.finish_reason``; status ERROR on an abort.

All of it runs under the engine lock (``EngineWorker``), so a request's ``RequestTrace`` is touched by
one thread at a time. With tracing off no request has a trace and :func:`record_step` is not called.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.common import tracing
from services.engine.request import Request, RequestStatus
from services.engine.step_batch import ScheduledRequest


@dataclass
class RequestTrace:
    parent: Any  # opentelemetry Context of the span the engine's spans hang under
    queued_ns: int | None = None
    chunks: int = 0
    decode: Any = None  # the open ``decode`` span

    def finished(self, request: Request) -> None:
        """The engine's hook (``services.engine.request_trace``): close the ``decode`` span."""
        end_request(request)


def trace_request(request: Request, parent: Any, queued: bool = False) -> None:
    """Have the engine thread record ``request``'s spans under ``parent`` (no-op when it is None)."""
    if parent is not None:
        request.trace = RequestTrace(parent, time.time_ns() if queued else None)


def record_step(scheduled: Iterable[ScheduledRequest], start_ns: int, end_ns: int) -> None:
    """After the model ran a step (``start_ns`` .. ``end_ns``), before its results are recorded."""
    for item in scheduled:
        request = item.request
        trace: RequestTrace | None = request.trace
        if trace is None:
            continue
        if item.start < request.num_prompt_tokens:
            _prefill_chunk(request, trace, item, start_ns, end_ns)
        elif trace.decode is None:
            trace.decode = tracing.start_span("decode", trace.parent, start_ns, request_id=request.request_id)


def _prefill_chunk(request: Request, trace: RequestTrace, item: ScheduledRequest, start_ns: int,
                   end_ns: int) -> None:
    if trace.chunks == 0 and trace.queued_ns is not None:
        queued = tracing.start_span("queue", trace.parent, trace.queued_ns, request_id=request.request_id)
        queued.end(end_time=start_ns)
    chunk = tracing.start_span("prefill_chunk", trace.parent, start_ns, request_id=request.request_id,
                               chunk_index=trace.chunks, tokens=item.num_new_tokens, start_token=item.start)
    chunk.end(end_time=end_ns)
    trace.chunks += 1


def end_request(request: Request) -> None:
    """The request finished (or left this node): close its ``decode`` span."""
    trace: RequestTrace | None = request.trace
    if trace is None or trace.decode is None:
        return
    span, trace.decode = trace.decode, None
    span.set_attribute("pdserve.output_tokens", request.num_output_tokens)
    span.set_attribute("pdserve.finish_reason", request.finish_reason or "")
    if request.status is RequestStatus.FINISHED_ABORTED:
        tracing.fail(span, "aborted")
    span.end()

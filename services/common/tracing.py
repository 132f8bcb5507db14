"""OpenTelemetry tracing for every service: setup from the standard ``OTEL_*`` variables, spans, and the
W3C trace context carried across gRPC hops in metadata, so that one request is one trace.

Call ``setup_tracing("pdserve-<service>")`` once in ``main.py`` (next to ``setup_logging``) and
``shutdown_tracing()`` when the server has stopped, so the spans of the last requests are exported.
``OTEL_TRACES_EXPORTER`` picks the exporter:

- unset or ``none``: tracing is off. Nothing is installed; :func:`enabled` is False and every helper
  here returns at once (no span objects, no attribute dicts, no metadata on calls).
- ``otlp``: OTLP, batched, over the protocol ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` names: ``grpc`` (the default) or ``http/protobuf``; the exporter reads
  ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_INSECURE`` and the rest itself; ``OTEL_BSP_*``
  tune the batching.
- ``console``: spans as JSON on stdout (debugging).

The resource comes from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, with the service's own
name when neither sets ``service.name``. The provider is this module's own (not the global one), so
tests can install an in-memory exporter and remove it again.

Propagation contract: a client puts :func:`outgoing` into the ``metadata`` of every internal call; a
servicer method decorated with :func:`traced_rpc` extracts it and runs inside a SERVER span of that
name. Internal services only *continue* traces (a call without a trace context gets no span: node
status polls, offload traffic); ``root=True`` (the gateway's ``Generate``) starts one when none came in.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

import structlog
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

EXPORTERS = ("none", "otlp", "console")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
REQUEST_ID = "pdserve.request_id"

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None
F = TypeVar("F", bound=Callable[..., Any])


def setup_tracing(service_name: str, *, exporter: SpanExporter | None = None,
                  environ: Mapping[str, str] | None = None) -> bool:
    """Install tracing as ``OTEL_TRACES_EXPORTER`` says (or with ``exporter``, exported span by span: for
    tests). Returns whether tracing is on. Replaces an earlier setup (after shutting it down)."""
    environ = os.environ if environ is None else environ
    if exporter is not None:
        processors = [SimpleSpanProcessor(exporter)]
    else:
        processors = [BatchSpanProcessor(e) for e in _exporters(environ.get("OTEL_TRACES_EXPORTER", ""), environ)]
    shutdown_tracing()
    if not processors:
        return False
    global _provider, _tracer
    provider = TracerProvider(resource=_resource(service_name))
    for processor in processors:
        provider.add_span_processor(processor)
    _provider, _tracer = provider, provider.get_tracer("pdserve")
    return True


def _otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    """OTLP over the protocol the standard variables name (``grpc`` when none does)."""
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc").strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    else:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: expected one of {OTLP_PROTOCOLS}, got {protocol!r}")
    return OTLPSpanExporter()


def _exporters(setting: str, environ: Mapping[str, str]) -> list[SpanExporter]:
    names = [n.strip().lower() for n in setting.split(",") if n.strip()]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "none":
            continue
        if name == "otlp":
            exporters.append(_otlp_exporter(environ))
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER: expected one of {EXPORTERS}, got {name!r}")
    return exporters


def _resource(service_name: str) -> Resource:
    detected = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        return detected.merge(Resource({SERVICE_NAME: service_name}))
    return detected


def shutdown_tracing() -> None:
    """Export what is buffered and turn tracing off. Safe to call when it is off."""
    global _provider, _tracer
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()  # flushes the batch processors


def enabled() -> bool:
    return _tracer is not None


def tracer() -> trace.Tracer:
    """The service's tracer (a no-op one when tracing is off)."""
    return _tracer or trace.NoOpTracer()


# ---- context --------------------------------------------------------------------------------------

def current_context() -> Context | None:
    """The current trace context, to hand to work that runs elsewhere (engine thread); None when off."""
    if _tracer is None:
        return None
    from opentelemetry.context import get_current

    return get_current()


def outgoing(context: Context | None = None) -> tuple[tuple[str, str], ...] | None:
    """Metadata for an outgoing gRPC call: the W3C ``traceparent`` of ``context`` (default: the current
    one). None when tracing is off or there is no span to continue."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return tuple(carrier.items()) or None


def incoming(metadata: Any) -> Context | None:
    """The trace context a caller sent in ``metadata`` (``context.invocation_metadata()``), or None."""
    carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
    if "traceparent" not in carrier:
        return None
    context = propagate.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def bind_request(request_id: str, span: Span | None = None) -> None:
    """Bind ``request_id`` to every log line of the current task and, when tracing, to the span."""
    if not request_id:
        return
    structlog.contextvars.bind_contextvars(request_id=request_id)
    if _tracer is not None:
        (span or trace.get_current_span()).set_attribute(REQUEST_ID, request_id)


# ---- spans ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def span(name: str, context: Context | None = None, **attributes: Any) -> Iterator[Span]:
    """A child span of ``context`` (default: the current span), current inside the block. An exception
    that escapes sets its status to ERROR. No-op when tracing is off or there is no parent span."""
    if _tracer is None or not _has_span(context):
        yield INVALID_SPAN
        return
    with _tracer.start_as_current_span(name, context=context, attributes=_attributes(attributes)) as current:
        yield current


def start_span(name: str, parent: Context | None, start_ns: int | None = None, **attributes: Any) -> Span:
    """A span that is not made current, for work on another thread: end it with ``span.end(end_time=)``."""
    if _tracer is None or parent is None or not _has_span(parent):
        return INVALID_SPAN
    return _tracer.start_span(name, context=parent, start_time=start_ns, attributes=_attributes(attributes))


def _has_span(context: Context | None) -> bool:
    """Whether ``context`` (default: the current one) holds a span to be the parent: spans here only
    continue a trace, they never start one."""
    return trace.get_current_span(context).get_span_context().is_valid


def context_with(span_: Span) -> Context | None:
    """A context whose current span is ``span_`` (for :func:`outgoing` or a child), None when off."""
    return trace.set_span_in_context(span_) if _tracer is not None else None


def end(span_: Span, error: str = "", **attributes: Any) -> None:
    """End a span from :func:`start_span` with ``attributes``; a non-empty ``error`` sets status ERROR."""
    if not span_.is_recording():
        return
    span_.set_attributes(_attributes(attributes))
    if error:
        fail(span_, error)
    span_.end()


def fail(span_: Span, description: str) -> None:
    """Mark ``span_`` as failed without an exception (a refused or aborted request)."""
    if span_.is_recording():
        span_.set_status(Status(StatusCode.ERROR, description))


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {key if "." in key else f"pdserve.{key}": value for key, value in attributes.items()
            if value is not None}


def start_server_span(name: str, metadata: Any, *, request_id: str = "", root: bool = False) -> Span:
    """The SERVER span of one RPC, started (not current); continues the caller's trace (see the module
    docstring), ``INVALID_SPAN`` when there is none to record. Binds ``request_id`` to the task's log lines
    whether tracing is on or not."""
    if request_id:
        structlog.contextvars.bind_contextvars(request_id=request_id)
    if _tracer is None:
        return INVALID_SPAN
    parent = incoming(metadata)
    if parent is None and not root:
        return INVALID_SPAN
    attributes = {REQUEST_ID: request_id} if request_id else None
    return _tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


@contextlib.contextmanager
def server_span(name: str, metadata: Any, *, request_id: str = "", root: bool = False) -> Iterator[Span]:
    """:func:`start_server_span`, current inside the block and ended with it."""
    with trace.use_span(start_server_span(name, metadata, request_id=request_id, root=root),
                        end_on_exit=True) as rpc:
        yield rpc


def traced_rpc(name: str, *, root: bool = False) -> Callable[[F], F]:
    """Decorate an async servicer method (unary or streaming, request or request iterator) to run inside
    :func:`server_span`; ``request.request_id``, when the request has one, is bound. Put it under
    ``@grpc_errors`` so that mapped errors mark the span before they become a status."""

    def decorate(method: F) -> F:
        def metadata(context: Any) -> Any:
            return context.invocation_metadata() if _tracer is not None else None

        if inspect.isasyncgenfunction(method):
            @functools.wraps(method)
            async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
                # current only while the handler runs, never across a yield: a stream closed after its RPC
                # ended is closed from another task, where a context attached here could not be detached
                rpc = start_server_span(name, metadata(context), request_id=_request_id(request), root=root)
                try:
                    async with contextlib.aclosing(method(self, request, context)) as items:
                        while True:
                            with trace.use_span(rpc, end_on_exit=False):
                                try:
                                    item = await anext(items)
                                except StopAsyncIteration:
                                    break
                            yield item
                finally:
                    rpc.end()

            return stream  # type: ignore[return-value]

        @functools.wraps(method)
        async def unary(self: Any, request: Any, context: Any) -> Any:
            with server_span(name, metadata(context), request_id=_request_id(request), root=root):
                return await method(self, request, context)

        return unary  # type: ignore[return-value]

    return decorate


def _request_id(request: Any) -> str:
    value = getattr(request, "request_id", "")
    return value if isinstance(value, str) else ""


# ---- logs -----------------------------------------------------------------------------------------

def add_trace_ids(logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: ``trace_id`` and ``span_id`` (hex) of the current span, when tracing is on."""
    if _tracer is not None:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            event_dict.setdefault("trace_id", format(context.trace_id, "032x"))
            event_dict.setdefault("span_id", format(context.span_id, "016x"))
    return event_dict

"""The gateway's ``/metrics``: per-request latency histograms and counts (it sees every token), requests in
flight, and the nodes it knows by role and health.

A ``Generate`` call is tracked around the whole handler (:func:`tracked`, or :meth:`GatewayMetrics.track`),
which sees every ``GenerateChunk`` it sends:

- ``pdserve_request_ttft_seconds``: call start → first token out;
- ``pdserve_request_tpot_seconds``: (last token − first token) / (completion tokens − 1), requests with ≥ 2;
- ``pdserve_request_e2e_seconds``: call start → the last message, requests that finished;
- ``pdserve_requests_total{outcome}``: ``stop``/``length``/``abort`` (the finish reason), or the status code
  the call ended with (``invalid_argument``, ``resource_exhausted``, ``unavailable``,
  ``deadline_exceeded``, ``cancelled`` when the client went away, ``unknown`` for a bug);
- prompt, cached (prefix hit) and generated tokens of the finished requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from services.common.errors import mapped_errors, status_of
from services.common.metrics import LoopCollector, new_registry
from services.common.request_parsing import RAISES_UNPARSABLE, UnparsableRequest
from services.gateway.generation import GenerateChunk
from services.gateway.nodes import DECODE, PREFILL, ROLES, NodeInfo

FINISH_REASONS = ("stop", "length", "abort")
# Buckets for a CPU model: milliseconds (a cached prompt, one decode step) to tens of seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
                10.0, 20.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
               300.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ttft = Histogram("pdserve_request_ttft_seconds", "Time to first token, from the call's start",
                              buckets=TTFT_BUCKETS, registry=registry)
        self.tpot = Histogram("pdserve_request_tpot_seconds", "Time per output token after the first (mean over "
                              "a request)", buckets=TPOT_BUCKETS, registry=registry)
        self.e2e = Histogram("pdserve_request_e2e_seconds", "Time from the call's start to its last message, "
                             "finished requests", buckets=E2E_BUCKETS, registry=registry)
        self.requests = Counter("pdserve_requests", "Generate calls ended, by finish reason or status code",
                                ["outcome"], registry=registry)
        for reason in FINISH_REASONS:  # present (at 0) from the start, so rates over them work at once
            self.requests.labels(reason)
        self.prompt_tokens = Counter("pdserve_request_prompt_tokens", "Prompt tokens of finished requests",
                                     registry=registry)
        self.cached_tokens = Counter("pdserve_request_cached_tokens", "Prompt tokens of finished requests served "
                                     "from a prefix cache", registry=registry)
        self.generation_tokens = Counter("pdserve_request_generation_tokens", "Tokens generated for finished "
                                         "requests", registry=registry)
        self.retries = Counter("pdserve_gateway_retries", "Requests started over on other nodes after one failed "
                               "before the first token, by the failed node's role", ["role"], registry=registry)
        for role in (PREFILL, DECODE):
            self.retries.labels(role)
        self.in_flight = Gauge("pdserve_requests_in_flight", "Generate calls in progress", registry=registry)
        self.embeddings = Counter("pdserve_embeddings", "Inputs embedded or refused (a gRPC Embed call, one input of "
                                  "/v1/embeddings), by outcome: ok, or the status code", ["outcome"], registry=registry)
        self.embeddings.labels("ok")
        self.embedding_tokens = Counter("pdserve_embedding_prompt_tokens", "Prompt tokens of the inputs embedded",
                                        registry=registry)

    def embedded(self, error: BaseException | None, prompt_tokens: int) -> None:
        """One input's embedding ended: done (``error`` None, its ``prompt_tokens``) or failed."""
        self.embeddings.labels("ok" if error is None else outcome_of(error)).inc()
        self.embedding_tokens.inc(prompt_tokens)

    def track(self) -> RequestTracker:
        """A context manager for one ``Generate`` call; feed it every chunk sent (:meth:`RequestTracker.sent`)."""
        return RequestTracker(self)


class RequestTracker:
    def __init__(self, metrics: GatewayMetrics, clock: Callable[[], float] = time.perf_counter) -> None:
        self.metrics = metrics
        self.clock = clock
        self.started = 0.0
        self.first_at: float | None = None
        self.outcome: str | None = None

    def __enter__(self) -> RequestTracker:
        self.started = self.clock()
        self.metrics.in_flight.inc()
        return self

    def sent(self, chunk: GenerateChunk) -> None:
        """``chunk`` is about to go to the client."""
        now = self.clock()
        m = self.metrics
        if self.first_at is None and (chunk.token_ids or chunk.finish_reason):
            self.first_at = now
            m.ttft.observe(now - self.started)
        if not chunk.finish_reason or self.outcome is not None:
            return
        self.outcome = chunk.finish_reason
        m.requests.labels(chunk.finish_reason).inc()
        m.e2e.observe(now - self.started)
        if (usage := chunk.usage) is not None:
            m.prompt_tokens.inc(usage.prompt_tokens)
            m.cached_tokens.inc(usage.cached_tokens)
            m.generation_tokens.inc(usage.completion_tokens)
            if usage.completion_tokens > 1 and self.first_at is not None:
                m.tpot.observe((now - self.first_at) / (usage.completion_tokens - 1))

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.metrics.in_flight.dec()
        if self.outcome is None:
            self.outcome = outcome_of(error)
            self.metrics.requests.labels(self.outcome).inc()


Generate = Callable[[Any, Any, Any], AsyncIterator[GenerateChunk]]
Encoded = Callable[[Any, Any, Any], AsyncIterator[Any]]


def tracked(encode: Callable[[GenerateChunk], Any]) -> Callable[[Generate], Encoded]:
    """Decorate the servicer's ``Generate`` (under ``@grpc_errors``), written as yielding ``GenerateChunk`` items,
    so ``self.metrics`` (a :class:`GatewayMetrics`, or None for no metrics) sees every call and every chunk
    it sends; what the call yields is ``encode(chunk)``."""

    def decorate(method: Generate) -> Encoded:
        @functools.wraps(method)
        async def generate(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            metrics: GatewayMetrics | None = self.metrics
            if isinstance(request, UnparsableRequest):  # counted as the refusal it is
                with metrics.track() if metrics is not None else contextlib.nullcontext():
                    raise request.refusal()
            with metrics.track() if metrics is not None else contextlib.nullcontext() as tracker:
                try:
                    async with contextlib.aclosing(method(self, request, context)) as chunks:
                        async for chunk in chunks:
                            if tracker is not None:
                                tracker.sent(chunk)
                            yield encode(chunk)
                except (asyncio.CancelledError, GeneratorExit):
                    if tracker is not None and tracker.outcome is None and _deadline_passed(context):
                        tracker.outcome = "deadline_exceeded"  # gRPC cancels the call when its deadline passes
                        tracker.metrics.requests.labels(tracker.outcome).inc()
                    raise

        setattr(generate, RAISES_UNPARSABLE, True)
        return generate

    return decorate


def _deadline_passed(context: Any) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


def outcome_of(error: BaseException | None) -> str:
    """The status code a call that ended without a finish reason ends with, lower case."""
    if error is None or isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"  # the client stopped reading (or the call was cancelled)
    if isinstance(error, mapped_errors()):
        return status_of(error).name.lower()
    return "unknown"


def gateway_registry(nodes: Callable[[], list[NodeInfo]], loop: asyncio.AbstractEventLoop,
                     tokenizing: Callable[[], int] = lambda: 0) -> tuple[CollectorRegistry, GatewayMetrics]:
    """The gateway's registry: request metrics, ``pdserve_gateway_nodes{role, state}`` read from ``nodes()``
    (the directory) on ``loop`` at scrape time, and ``pdserve_gateway_tokenizing`` (prompts waiting for a
    tokenizing thread or on one: ``tokenizing()``)."""
    registry = new_registry("gateway")
    metrics = GatewayMetrics(registry)
    Gauge("pdserve_gateway_tokenizing", "Long prompts waiting for a tokenizing thread or being tokenized on one",
          registry=registry).set_function(tokenizing)

    async def read() -> list[NodeInfo]:
        return nodes()

    registry.register(LoopCollector(loop, read, _node_families))
    return registry, metrics


def _node_families(nodes: list[NodeInfo]) -> Iterator[Metric]:
    tally = Tally((n.role, n.healthy) for n in nodes)
    family = GaugeMetricFamily("pdserve_gateway_nodes", "Nodes this gateway knows, by role and health",
                               labels=["role", "state"])
    for role in ROLES:
        for healthy in (True, False):
            family.add_metric([role, "healthy" if healthy else "unhealthy"], tally[(role, healthy)])
    yield family

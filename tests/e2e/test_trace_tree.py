"""One disaggregated request is one trace across the gateway, prefill node, decode node and cache-store.

Real processes with ``OTEL_TRACES_EXPORTER=otlp`` export to an OTLP collector served by this test
(``TraceService/Export`` on an ephemeral loopback port). The prefill node runs the prompt in several
chunks. After the request, the cluster is stopped (each process flushes its spans after its drain) and the
collected spans must form one tree rooted at the gateway's ``Generate``, with the hops and the engine's
spans where DESIGN.md and the services' READMEs put them. The processes' JSON log lines about the request
carry its ``request_id`` and that trace's id.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from concurrent import futures
from dataclasses import dataclass

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from tests.e2e.conftest import ENGINE_ARGS, GATEWAY_ARGS, greedy

pytestmark = pytest.mark.slow
CHUNK = 64  # --max-num-batched-tokens of the prefill node
PROMPT = [1000 + (i * 37) % 20000 for i in range(200)]  # 4 chunks: 64 + 64 + 64 + 8
NEW_TOKENS = 8
REQUEST_ID = "trace-tree-1"


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict

    def within(self, other: Span) -> bool:
        return other.start <= self.start and self.end <= other.end


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()

    def Export(self, request, context):
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    attributes = {a.key: _value(a.value) for a in s.attributes}
                    received.append(Span(resource.get("service.name", ""), s.name, s.trace_id.hex(), s.span_id.hex(),
                                         s.parent_span_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano,
                                         attributes))
        with self._lock:
            self.spans += received
        return trace_service_pb2.ExportTraceServiceResponse()


def _value(value):
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture(scope="module")
def collector():
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield collector, port
    finally:
        server.stop(None)


@pytest.fixture(scope="module")
def traced_run(collector, tmp_path_factory):
    """Run one request on a traced cluster, stop the cluster; (spans, log lines, responses)."""
    collector, port = collector
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
           "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "100", "PDSERVE_LOG_FORMAT": "json",
           "PDSERVE_LOG_LEVEL": "debug"}
    spec = ClusterSpec(engine_args=ENGINE_ARGS, gateway_args=GATEWAY_ARGS, prefill_cache_store=True, env=env,
                       prefill_args=("--max-num-batched-tokens", str(CHUNK)))
    log_path = tmp_path_factory.mktemp("trace-tree") / "cluster.log"
    request = gateway_pb2.GenerateRequest(request_id=REQUEST_ID, token_ids=PROMPT, sampling=greedy(NEW_TOKENS))
    with (open(log_path, "wb") as log_file, start_cluster(spec, stderr=log_file.fileno()) as cluster,
          grpc.insecure_channel(cluster.address) as channel):
        responses = list(gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120))
    lines = [json.loads(raw) for raw in log_path.read_text().splitlines() if raw.startswith("{")]
    return list(collector.spans), lines, responses


def test_one_request_is_one_trace_across_every_service(traced_run):
    spans, _, responses = traced_run
    assert sum(len(r.token_ids) for r in responses) == NEW_TOKENS
    assert len({s.trace_id for s in spans}) == 1, Counter((s.trace_id, s.service) for s in spans)
    assert {s.service for s in spans} == {"pdserve-gateway", "pdserve-prefill", "pdserve-decode",
                                          "pdserve-cache-store"}


def test_the_spans_form_one_tree_rooted_at_the_gateway(traced_run):
    spans, _, _ = traced_run
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans), "span ids repeat"
    roots = [s for s in spans if not s.parent_id]
    assert [(r.service, r.name) for r in roots] == [("pdserve-gateway", "Generate")]
    orphans = [(s.service, s.name) for s in spans if s.parent_id and s.parent_id not in by_id]
    assert not orphans, f"spans whose parent is missing from the trace: {orphans}"

    def one(service: str, name: str) -> Span:
        found = [s for s in spans if s.service == service and s.name == name]
        assert len(found) == 1, f"{service} {name}: {len(found)} spans"
        return found[0]

    def parent(span: Span) -> Span:
        return by_id[span.parent_id]

    generate = one("pdserve-gateway", "Generate")
    assert generate.attributes["pdserve.request_id"] == REQUEST_ID
    for name in ("tokenize", "route", "detokenize"):
        assert parent(one("pdserve-gateway", name)) is generate
    assert one("pdserve-gateway", "route").within(generate)

    prefill = one("pdserve-prefill", "Prefill")
    assert parent(prefill) is generate and prefill.start >= generate.start
    for name in ("queue", "reserve", "cache_store.fetch", "kv_transfer", "commit"):
        child = one("pdserve-prefill", name)
        assert parent(child) is prefill, name
        assert child.within(prefill), f"{name} is not within the prefill node's Prefill span"

    chunks = sorted((s for s in spans if s.name == "prefill_chunk"), key=lambda s: s.start)
    assert len(chunks) == math.ceil(len(PROMPT) / CHUNK)
    assert {(c.service, parent(c).span_id) for c in chunks} == {("pdserve-prefill", prefill.span_id)}
    assert [c.attributes["pdserve.chunk_index"] for c in chunks] == list(range(len(chunks)))
    assert sum(c.attributes["pdserve.tokens"] for c in chunks) == len(PROMPT)
    assert all(c.within(prefill) for c in chunks)
    assert one("pdserve-prefill", "queue").end <= chunks[0].start

    reserve = one("pdserve-decode", "Reserve")
    assert parent(reserve) is one("pdserve-prefill", "reserve") and reserve.within(parent(reserve))
    transfer = one("pdserve-decode", "TransferKV")
    assert parent(transfer) is one("pdserve-prefill", "kv_transfer") and transfer.start >= parent(transfer).start
    assert parent(one("pdserve-decode", "commit")) is transfer

    attach = one("pdserve-decode", "Attach")
    assert parent(attach) is generate
    decode = one("pdserve-decode", "decode")
    assert parent(decode).service == "pdserve-decode" and parent(decode).name in ("Attach", "commit")
    if parent(decode) is attach:
        assert decode.within(attach)
    assert decode.attributes["pdserve.output_tokens"] == NEW_TOKENS  # the first token, from P, included
    assert decode.start >= one("pdserve-prefill", "commit").start

    lookup = one("pdserve-cache-store", "Lookup")
    assert parent(lookup) is one("pdserve-prefill", "cache_store.fetch")
    put = one("pdserve-cache-store", "Put")  # the prompt's blocks written back after the request
    assert parent(put).name == "cache_store.write_back" and parent(parent(put)) is prefill


def test_log_lines_of_the_request_carry_its_trace_id(traced_run):
    spans, lines, _ = traced_run
    trace_id = spans[0].trace_id
    lines = [line for line in lines if line.get("request_id") == REQUEST_ID]
    mine = {line["event"]: line for line in lines}
    # one line from each of the gateway, the prefill node and the decode node (the last two at debug level)
    for event in ("request finished", "prefilled", "decode finished"):
        assert event in mine, f"no {event!r} line with the request id; lines with it: {sorted(mine)}"
        assert mine[event].get("trace_id") == trace_id, mine[event]
    assert all(line.get("trace_id", trace_id) == trace_id for line in lines)

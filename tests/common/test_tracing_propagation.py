"""The trace context crosses a real grpc.aio hop — unary, server-streaming and client-streaming — in
metadata: the server's span is a child of the caller's, in the same trace; without a caller's context no
server span is made; a failed call marks its span; with tracing off no metadata is sent at all."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from opentelemetry.trace import SpanKind, StatusCode
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc

from services.cache_store.client import AsyncCacheStoreClient
from services.cache_store.servicer import CacheStoreServicer, add_to_server
from services.cache_store.store import BlockStore
from services.common import tracing
from services.common.server import NodeServer, ServiceBinding
from tests.cache_store.helpers import key, layout


class MetadataSpy(grpc.aio.ServerInterceptor):
    """Records the metadata keys of every call the server receives."""

    def __init__(self) -> None:
        self.keys: list[set[str]] = []

    async def intercept_service(self, continuation, handler_call_details):
        self.keys.append({k for k, _ in handler_call_details.invocation_metadata or ()})
        return await continuation(handler_call_details)


@pytest.fixture
async def store():
    """A real cache-store servicer on a grpc.aio server, and an asyncio client of it."""
    servicer = CacheStoreServicer(BlockStore(1 << 20), chunk_bytes=1 << 10)
    binding = ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer, add_to_server)
    spy = MetadataSpy()
    server = NodeServer([binding], listen="127.0.0.1:0", grace_s=0, interceptors=[spy])
    await server.start()
    client = AsyncCacheStoreClient(server.address, layout())
    try:
        yield client, spy
    finally:
        await client.close()
        await server.shutdown()


async def test_server_spans_are_children_of_the_callers_span(store, spans):
    client, _ = store
    data = bytes(range(256)) * 10  # several Get chunks
    with tracing.tracer().start_as_current_span("caller") as caller:
        await client.put([(key("a"), data)])  # client-streaming
        assert await client.lookup([key("a"), key("b")]) == 1  # unary
        assert await client.get([key("a")]) == [data]  # server-streaming
    assert await client.lookup([key("a")]) == 1  # outside any trace: no span on the server

    server_spans = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert sorted(s.name for s in server_spans) == ["Get", "Lookup", "Put"]
    context = caller.get_span_context()
    for span in server_spans:
        assert span.context.trace_id == context.trace_id, f"{span.name} is in another trace"
        assert span.parent is not None and span.parent.span_id == context.span_id
        assert span.parent.is_remote, f"{span.name}: its parent did not come over the wire"
        assert span.status.status_code is not StatusCode.ERROR


async def test_a_failed_call_marks_the_server_span(store, spans):
    client, _ = store
    with tracing.tracer().start_as_current_span("caller"), pytest.raises(grpc.aio.AioRpcError) as failed:
        await client.get([key("missing")])
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    (get,) = [s for s in spans.get_finished_spans() if s.name == "Get"]
    assert get.status.status_code is StatusCode.ERROR


async def test_with_tracing_off_calls_carry_no_trace_metadata(store):
    client, spy = store
    tracing.shutdown_tracing()
    with tracing.tracer().start_as_current_span("caller"):
        await client.lookup([key("a")])
    stub = cache_store_pb2_grpc.CacheStoreStub(client._calls().channel)  # the channel the client calls on
    await stub.Lookup(cache_store_pb2.LookupRequest(keys=[key("a")]), metadata=(("x-probe", "1"),))
    assert len(spy.keys) == 2
    assert "traceparent" not in spy.keys[0]
    assert "x-probe" in spy.keys[1]  # the spy does see metadata that is sent

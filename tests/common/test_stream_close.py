"""A server-streaming handler's generators are closed when its RPC ends, however it ends.

grpc.aio leaves a handler's async generator suspended at its ``yield`` when the call ends while the
handler waits for a message to be sent (the client cancelled with messages unread): its ``finally``
blocks — a request's cleanup — then run only when the generator is garbage-collected. A 30-minute soak
left prefill nodes with ``Prefill`` calls whose cleanup never ran (their aborts timed out, and the node's
drain waited for them until it was killed): something kept those generators referenced. The test keeps
the handler's generator referenced likewise; only the end of the RPC can close it. Real gRPC on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from services.common.errors import grpc_errors
from services.common.tracing import traced_rpc

MESSAGE = b"x" * (1 << 20)  # a few of these fill the flow-control windows: the handler then waits to send


class Streamer:
    """A servicer as pdserve's are: decorated, iterating a node's generator that holds the cleanup."""

    def __init__(self) -> None:
        self.kept: list[object] = []  # the handler's generators, referenced for good
        self.cleaned = asyncio.Event()

    async def node_events(self) -> AsyncIterator[bytes]:
        try:
            for _ in range(1000):
                yield MESSAGE
        finally:
            await asyncio.sleep(0)  # a cleanup that awaits, as a request's does
            self.cleaned.set()

    @grpc_errors
    @traced_rpc("Stream", root=True)
    async def Stream(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        events = self.node_events()
        async with contextlib.aclosing(events):
            async for event in events:
                yield event


async def test_a_cancelled_stream_whose_handler_waits_to_send_runs_its_cleanup():
    await _cancel_while_the_handler_waits_to_send()


async def test_with_tracing_the_closed_stream_ends_its_span_without_context_errors(spans, caplog):
    """The close runs in another task: a span kept current across the handler's yield could not be
    detached there (OpenTelemetry logged "Failed to detach context" with a traceback)."""
    await _cancel_while_the_handler_waits_to_send()
    assert [span.name for span in spans.get_finished_spans()] == ["Stream"]
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")], caplog.text


async def _cancel_while_the_handler_waits_to_send() -> None:
    streamer = Streamer()

    async def kept_stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """The servicer method's generator, kept referenced (the node's state did keep it, through the call's
        task): no garbage collection closes it; only the end of the RPC can."""
        stream = streamer.Stream(request, context)
        streamer.kept.append(stream)
        async for message in stream:
            yield message

    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(kept_stream, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Streamer", {"Stream": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream("/t.Streamer/Stream", request_serializer=None,
                                        response_deserializer=None)(b"")
            assert await call.read() == MESSAGE
            await asyncio.sleep(0.5)  # the server fills the windows and waits to send the next one
            assert not streamer.cleaned.is_set()
            call.cancel()
            await asyncio.wait_for(streamer.cleaned.wait(), 10)  # before the fix: never
    finally:
        await server.stop(0)

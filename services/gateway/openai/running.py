"""One generation request of the HTTP front: the gateway's flow, with what a gRPC ``Generate`` call has.

- the same root ``Generate`` SERVER span (continuing a W3C ``traceparent`` header when one came), current
  only while the request is opened (the flow keeps it as the parent of its own spans and outgoing calls);
- the same request metrics (``GatewayMetrics.track``): TTFT, TPOT, e2e, the outcome;
- cancellation: a client that disconnects cancels the flow, which aborts the request on its nodes and
  frees every block, as a cancelled gRPC call does.

The ``n`` choices of one HTTP request are ``n`` running requests of one :class:`RequestGroup`, which
watches the connection once for all of them.

``close()`` must run however the request ends (it is idempotent): it cancels a flow that is still
running, ends the span and settles the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterable

import structlog
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind
from starlette.types import Receive

from services.common import tracing
from services.gateway.core import GatewayCore
from services.gateway.generation import GenerateChunk, GenerateInput
from services.gateway.metrics import GatewayMetrics, RequestTracker
from services.gateway.request_flow import RequestFlow

log = structlog.get_logger(__name__)


class RequestGroup:
    """The running requests of one HTTP request (its ``n`` choices): the client's connection is watched
    once, from :meth:`watch` (or the first :meth:`RunningRequest.open`) until every member closed; a
    disconnect cancels them all, and what :meth:`unless_gone` is opening."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.members: list[RunningRequest] = []
        self._watcher: asyncio.Task[None] | None = None
        self._gone = asyncio.Event()
        self._opening: asyncio.Task[object] | None = None  # the task in unless_gone, while it opens
        self.disconnected = False

    def watch(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch_disconnect())

    def opened(self, member: RunningRequest) -> None:
        self.members.append(member)
        self.watch()

    def closed(self) -> None:
        """A member closed (or opening failed before any): the watch ends once none is open."""
        if self._watcher is not None and all(m.closed for m in self.members):
            self._watcher.cancel()

    async def unless_gone(self, opening: Awaitable[None]) -> bool:
        """Await ``opening`` (its prompts may wait for the tokenizing threads); False when the client left
        first and ``opening`` was cancelled (its queued tokenizing with it). It runs in the caller's task,
        so what it binds (log fields) stays bound."""
        self.watch()
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        self._opening = task
        try:
            await opening
            return True
        except asyncio.CancelledError:
            if not self._gone.is_set() or task.uncancel() > cancelling:  # cancelled by someone else too
                raise
            return False
        finally:
            self._opening = None

    async def _watch_disconnect(self) -> None:
        """The body was read already: the next message is the client going away."""
        with contextlib.suppress(asyncio.CancelledError):
            while (await self._receive())["type"] != "http.disconnect":
                pass
            self._gone.set()
            if self._opening is not None:
                self._opening.cancel("client disconnected")
            if not all(m.closed for m in self.members):
                log.info("HTTP client disconnected", request_ids=[m.flow.request_id for m in self.members if m.flow])
                self.disconnected = True
                for member in self.members:
                    member.cancel("client disconnected")


class RunningRequest:
    def __init__(self, core: GatewayCore, metrics: GatewayMetrics | None, request: GenerateInput,
                 headers: Iterable[tuple[str, str]], group: RequestGroup) -> None:
        self.core = core
        self.request = request
        self.flow: RequestFlow | None = None
        self._tracker: RequestTracker | None = metrics.track() if metrics is not None else None
        self._span = _root_span(request.request_id, headers)
        self._group = group
        self._tracking = False
        self.closed = False

    async def open(self) -> None:
        """Validate and tokenize (raises the gateway's named errors, before any node is called)."""
        structlog.contextvars.bind_contextvars(request_id=self.request.request_id)
        if self._tracker is not None:
            self._tracker.__enter__()
            self._tracking = True
        try:
            with trace.use_span(self._span, end_on_exit=False, record_exception=False):
                self.flow = await self.core.open(self.request, None)
        except BaseException as error:
            self.close(error)
            raise
        self._group.opened(self)

    async def chunks(self) -> AsyncIterator[GenerateChunk]:
        """The flow's chunks; the request is closed when they end, however they end."""
        assert self.flow is not None, "open() first"
        error: BaseException | None = None
        try:
            async for chunk in self.flow.run():
                if self._tracker is not None:
                    self._tracker.sent(chunk)
                yield chunk
        except BaseException as raised:
            error = raised
            raise
        finally:
            self.close(error)

    def cancel(self, reason: str) -> None:
        if self.flow is not None:
            self.flow.cancel(reason)

    def close(self, error: BaseException | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        self._group.closed()
        if self.flow is not None:
            self.flow.cancel("HTTP response ended before the request finished")  # no-op once it finished
        if self._group.disconnected:
            error = asyncio.CancelledError("client disconnected")  # counted as the gRPC path counts a cancel
        if self._tracker is not None and self._tracking:
            self._tracker.__exit__(type(error) if error else None, error, None)
        if error is not None:
            tracing.fail(self._span, f"{type(error).__name__}: {error}")
        self._span.end()


def _root_span(request_id: str, headers: Iterable[tuple[str, str]]) -> Span:
    """``Generate`` (SERVER): the root of the request's trace, or a child of the client's ``traceparent``."""
    if not tracing.enabled():
        return INVALID_SPAN
    return tracing.tracer().start_span("Generate", context=tracing.incoming(headers), kind=SpanKind.SERVER,
                                       attributes={tracing.REQUEST_ID: request_id})

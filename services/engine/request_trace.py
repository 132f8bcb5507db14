"""The engine's hook for request spans: a node that traces a request sets ``request.trace`` to an object
with a ``finished(request)`` method (the node side: ``services.engine_node.step_spans.RequestTrace``).

The engine knows nothing of tracing libraries; it only tells the hook when a request finished or left
this engine (handed over), under the engine lock. The spans of the steps themselves are recorded by the
node's worker around each step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from services.engine.request import Request


class RequestTrace(Protocol):
    def finished(self, request: Request) -> None:
        """The request finished or left this engine: close what is open for it."""


def end_trace(request: Request) -> None:
    """Tell the request's trace hook, if any, that the request ended here."""
    trace: RequestTrace | None = request.trace
    if trace is not None:
        trace.finished(request)

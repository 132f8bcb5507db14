"""``pdserve.v1.Admin``, served by every process next to health and reflection: operator actions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import grpc.aio
import structlog
from pdserve.v1 import admin_pb2, admin_pb2_grpc

from services.common.errors import FailedPreconditionError, InvalidArgumentError, grpc_errors

log = structlog.get_logger(__name__)

RebalanceHook = Callable[[int, float, str], Awaitable[tuple[Sequence[str], Sequence[str]]]]
"""A decode node's ``Rebalance``: (at most this many requests, within seconds, reason) → (moved, kept) ids."""

MAX_REBALANCE_REQUESTS = 1024
MAX_REBALANCE_MS = 600_000


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """``Drain`` asks the server to stop as SIGTERM does (NOT_SERVING → drain hook → exit); ``Rebalance``
    runs a decode node's hook (``rebalance()``; None elsewhere: ``FAILED_PRECONDITION``)."""

    def __init__(self, request_stop: Callable[[], None], is_stopping: Callable[[], bool],
                 rebalance: Callable[[], RebalanceHook | None] = lambda: None) -> None:
        self._request_stop = request_stop
        self._is_stopping = is_stopping
        self._rebalance = rebalance

    @grpc_errors
    async def Drain(self, request: admin_pb2.DrainRequest, context: grpc.aio.ServicerContext
                    ) -> admin_pb2.DrainResponse:
        if self._is_stopping():
            return admin_pb2.DrainResponse(already_draining=True)
        log.info("drain requested", reason=request.reason or "Admin/Drain", peer=context.peer())
        self._request_stop()
        return admin_pb2.DrainResponse(already_draining=False)

    @grpc_errors
    async def Rebalance(self, request: admin_pb2.RebalanceRequest, context: grpc.aio.ServicerContext
                        ) -> admin_pb2.RebalanceResponse:
        hook = self._rebalance()
        if hook is None:
            raise FailedPreconditionError("Rebalance: only a decode node moves running requests to its peers")
        if self._is_stopping():
            raise FailedPreconditionError("Rebalance: this node is draining (it moves every request itself)")
        if request.max_requests > MAX_REBALANCE_REQUESTS:
            raise InvalidArgumentError("max_requests", f"is {request.max_requests}, at most {MAX_REBALANCE_REQUESTS}")
        if request.within_ms > MAX_REBALANCE_MS:
            raise InvalidArgumentError("within_ms", f"is {request.within_ms}, at most {MAX_REBALANCE_MS}")
        log.info("rebalance requested", reason=request.reason or "Admin/Rebalance", peer=context.peer(),
                 max_requests=request.max_requests or 1)
        moved, kept = await hook(request.max_requests or 1, (request.within_ms or 10_000) / 1000, request.reason)
        return admin_pb2.RebalanceResponse(moved=list(moved), kept=list(kept))

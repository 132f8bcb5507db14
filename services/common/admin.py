"""``pdserve.v1.Admin``, served by every process next to health and reflection: operator actions."""

from __future__ import annotations

from collections.abc import Callable

import grpc.aio
import structlog
from pdserve.v1 import admin_pb2, admin_pb2_grpc

from services.common.errors import grpc_errors

log = structlog.get_logger(__name__)


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """``Drain`` asks the server to stop as SIGTERM does (NOT_SERVING → drain hook → exit)."""

    def __init__(self, request_stop: Callable[[], None], is_stopping: Callable[[], bool]) -> None:
        self._request_stop = request_stop
        self._is_stopping = is_stopping

    @grpc_errors
    async def Drain(self, request: admin_pb2.DrainRequest, context: grpc.aio.ServicerContext
                    ) -> admin_pb2.DrainResponse:
        if self._is_stopping():
            return admin_pb2.DrainResponse(already_draining=True)
        log.info("drain requested", reason=request.reason or "Admin/Drain", peer=context.peer())
        self._request_stop()
        return admin_pb2.DrainResponse(already_draining=False)

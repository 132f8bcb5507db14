"""The engine's errors as gRPC status codes, for both node roles (importing this module registers them
with ``services.common.errors.map_error``; ``node_config`` does, so every engine node has them)."""

from __future__ import annotations

import grpc

from services.common.errors import map_error
from services.engine.errors import EngineStoppedError, InvalidRequestError, ModelLoadError, UnknownRequestError
from services.engine.reservations import IncompleteTransferError

map_error(InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT)
map_error(UnknownRequestError, grpc.StatusCode.NOT_FOUND)
map_error(EngineStoppedError, grpc.StatusCode.UNAVAILABLE)
map_error(IncompleteTransferError, grpc.StatusCode.FAILED_PRECONDITION)
map_error(ModelLoadError, grpc.StatusCode.FAILED_PRECONDITION)

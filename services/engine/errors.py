"""Named errors of the engine. Servicers map them to gRPC status codes."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError):
    """The request is malformed; ``field`` names the offending input (maps to ``INVALID_ARGUMENT``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class DuplicateRequestError(InvalidRequestError):
    """A request id that is already in flight."""

    def __init__(self, request_id: str):
        super().__init__("request_id", f"request {request_id!r} is already running")


class UnknownRequestError(EngineError):
    """An operation named a request the engine does not hold."""


class ModelLoadError(EngineError):
    """Weights or configuration could not be read or do not describe a supported model."""


class EngineStoppedError(EngineError, RuntimeError):
    """The engine worker is stopped, or its thread failed (the node is unhealthy): nothing more runs here."""

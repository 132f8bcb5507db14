"""OpenAI's error shape (Anthropic's on ``/v1/messages``) and the HTTP status of every error the front can meet.

``{"error": {"message", "type", "param", "code"}}``; on ``/v1/messages``, ``{"type": "error", "error": {"type",
"message"}}`` (``OpenAIError.response(path)``, which the handlers and middlewares call with the request's path).
Bad input is 400 ``invalid_request_error`` with ``param`` naming the field (malformed JSON and schema errors
included: FastAPI's 422 is replaced), an unknown model 404 ``model_not_found``, an oversized body 413. The
gateway's named errors map by their gRPC status (``services.common.errors.status_of``): ``INVALID_ARGUMENT``
400, ``RESOURCE_EXHAUSTED`` 429, ``UNAVAILABLE`` 503 (no healthy node, draining, a node that failed),
``DEADLINE_EXCEEDED`` 504, anything else a node answered 502. Any other exception is a bug: 500, logged with its
traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from services.common.errors import ServiceError, status_of
from services.engine.errors import InvalidRequestError
from services.gateway.openai.responses import ErrorBody, ErrorDetail
from services.gateway.redaction import redact_addresses

log = structlog.get_logger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# gRPC status → (HTTP status, type, code)
_BY_STATUS: dict[grpc.StatusCode, tuple[int, str, str | None]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, INVALID_REQUEST, None),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "resource_exhausted"),
    grpc.StatusCode.UNAVAILABLE: (503, SERVER_ERROR, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, SERVER_ERROR, "timeout"),
    grpc.StatusCode.CANCELLED: (503, SERVER_ERROR, "cancelled"),
}
_UPSTREAM = (502, SERVER_ERROR, "bad_gateway")
_PARAMS = {"token_ids": "prompt"}  # the gateway's field names that OpenAI calls otherwise
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})  # pydantic union member tags


ANTHROPIC_PATH = "/v1/messages"  # Anthropic's Messages API: its errors have Anthropic's shape
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                   503: "overloaded_error"}


def is_anthropic_path(path: str) -> bool:
    """``path`` is Anthropic's Messages API (``/v1/messages`` or under it)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def anthropic_response(status: int, message: str) -> JSONResponse:
    """``{"type": "error", "error": {"type", "message"}}``, the type by the status (``api_error`` otherwise)."""
    return JSONResponse({"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"),
                                                    "message": message}}, status_code=status)


class OpenAIError(Exception):
    """An error response: raise it from a route, or send ``body()`` in a stream."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.detail)

    def response(self, path: str = "") -> JSONResponse:
        """In OpenAI's shape, or Anthropic's for a request to ``ANTHROPIC_PATH``."""
        if is_anthropic_path(path):
            return anthropic_response(self.status, self.detail.message)
        return JSONResponse(self.body().model_dump(), status_code=self.status)


def from_gateway(error: ServiceError | InvalidRequestError) -> OpenAIError:
    """The response to one of the gateway's named errors."""
    if isinstance(error, InvalidRequestError):
        param = _PARAMS.get(error.field, error.field)
        return OpenAIError(400, f"{param}: {error.message}", param=param)
    status, kind, code = _BY_STATUS.get(status_of(error), _UPSTREAM)
    return OpenAIError(status, redact_addresses(str(error)), kind, code=code)


def model_not_found(model: str, served: str) -> OpenAIError:
    return OpenAIError(404, f"The model {model!r} does not exist; this server serves {served!r}",
                       "not_found_error", param="model", code="model_not_found")


def draining() -> OpenAIError:
    return OpenAIError(503, "gateway is draining: not taking new requests", SERVER_ERROR,
                       code="service_unavailable")


def param_of(loc: Sequence[Any]) -> str | None:
    """``("body", "messages", 0, "content", "str")`` → ``"messages[0].content"``: the field a pydantic
    error names, without the leading ``body`` and the union member tags."""
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(item, int):
            if not parts:
                break  # a position in malformed JSON, not a field
            parts[-1] += f"[{item}]"
        elif isinstance(item, str) and item.isidentifier() and item not in _TYPE_NAMES:
            parts.append(item)
        else:
            break
    return ".".join(parts) or None


def _is_json(content_type: str) -> bool:
    """FastAPI's rule for a body it reads as JSON: ``application/json`` or ``application/*+json``."""
    media = content_type.split(";")[0].strip().lower()
    main, _, sub = media.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def from_validation(error: RequestValidationError, content_type: str = "application/json") -> OpenAIError:
    """``content_type``: the request's, named when a body that is not a JSON object came without JSON's."""
    first = error.errors()[0]
    kind, loc = first.get("type", ""), first.get("loc", ())
    if kind == "json_invalid":
        reason = first.get("ctx", {}).get("error", "")
        return OpenAIError(400, f"malformed JSON body: {reason}".rstrip(": "))
    param = param_of(loc)
    if kind == "missing" and param is None:
        return OpenAIError(400, "a JSON body is required")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None and not _is_json(content_type):  # FastAPI parses JSON only when told it is JSON
        message += f" (the body is read as JSON only with Content-Type: application/json, got {content_type!r})"
    return OpenAIError(400, f"{param or 'request body'}: {message}", param=param)


def install(app: FastAPI) -> None:
    """Every error the app can answer with gets OpenAI's shape."""

    async def openai_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, OpenAIError)
        return error.response(request.url.path)

    async def gateway_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, (ServiceError, InvalidRequestError))
        return from_gateway(error).response(request.url.path)

    async def validation_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return from_validation(error, request.headers.get("content-type", "")).response(request.url.path)

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        kind = "not_found_error" if error.status_code == 404 else INVALID_REQUEST
        if error.status_code == 413:  # a chunked body past the limit (BodyLimit): as from its Content-Length
            return OpenAIError(413, str(error.detail), param="body", code="request_too_large").response(
                request.url.path)
        cause = error.__cause__  # FastAPI's "error parsing the body": bytes that are not UTF-8, deep nesting
        if error.status_code == 400 and isinstance(cause, (UnicodeDecodeError, RecursionError)):
            return OpenAIError(400, f"malformed JSON body: {type(cause).__name__}: {cause}").response(request.url.path)
        return OpenAIError(error.status_code, str(error.detail), kind).response(request.url.path)

    async def bug(request: Request, error: Exception) -> JSONResponse:
        log.exception("HTTP request failed", path=request.url.path, exc_info=error)
        return OpenAIError(500, f"internal error: {type(error).__name__}", SERVER_ERROR).response(request.url.path)

    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(ServiceError, gateway_error)
    app.add_exception_handler(InvalidRequestError, gateway_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, bug)

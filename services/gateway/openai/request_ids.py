"""A generation request's id: the response's ``id``, the gateway's and the nodes' request id, and the
``X-Request-Id`` header the response echoes."""

from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import Response

from services.gateway.openai import errors

MAX_HEADER_ID_CHARS = 128


def request_id_of(request: Request, prefix: str, separator: str = "-") -> tuple[str, str]:
    """The request's id (the response's ``id``, the gateway's and the nodes' request id) and the
    ``X-Request-Id`` the response echoes: ``<prefix>-<X-Request-Id>`` when the client sent one (as vLLM
    does), else ``<prefix>-<fresh hex>`` (echoed whole); ``separator``: ``_`` for ids spelled as OpenAI's
    Responses spells them (``resp_…``)."""
    given = request.headers.get("x-request-id")
    if given is None:
        fresh = f"{prefix}{separator}{uuid.uuid4().hex}"
        return fresh, fresh
    if not given or len(given) > MAX_HEADER_ID_CHARS or not given.isprintable():
        raise errors.OpenAIError(400, f"X-Request-Id: must be 1 to {MAX_HEADER_ID_CHARS} printable characters",
                                 param="X-Request-Id")
    return f"{prefix}{separator}{given}", given


def echoed(response: Response, request_id: str) -> Response:
    response.headers["X-Request-Id"] = request_id
    return response

"""ASGI middleware: ``Authorization: Bearer <key>`` on the HTTP front's API paths (on Anthropic's
``/v1/messages``, ``x-api-key: <key>`` too, as the ``anthropic`` package sends it; the first of a repeated header).

As vLLM's ``--api-key``: paths under ``/v1`` (and ``/tokenize``, ``/detokenize``) need a configured key;
``/health`` and anything else stay open. A request without a key, or with a wrong one, gets 401 in OpenAI's
shape (Anthropic's on ``/v1/messages``) before its body is read (OpenAI answers a missing key with ``code:
null`` and a wrong one with ``code: "invalid_api_key"``, both ``type: "invalid_request_error"``), with
``WWW-Authenticate: Bearer``.
The message never repeats the key that was sent.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway.api_keys import MISSING, ApiKeys, bearer
from services.gateway.openai.errors import OpenAIError, is_anthropic_path

PROTECTED_EXACT = frozenset({"/v1", "/tokenize", "/detokenize"})

_MISSING_MESSAGE = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
                    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
_INVALID_MESSAGE = "Incorrect API key provided."


def protected(path: str) -> bool:
    return path in PROTECTED_EXACT or path.startswith("/v1/")


def unauthorized(problem: str) -> OpenAIError:
    if problem == MISSING:
        return OpenAIError(401, _MISSING_MESSAGE)
    return OpenAIError(401, _INVALID_MESSAGE, code="invalid_api_key")


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys.enabled or not protected(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", ())
        header = next((value for name, value in headers if name == b"authorization"), None)
        path = scope.get("path", "")
        if header is None and is_anthropic_path(path):
            key = next((value for name, value in headers if name == b"x-api-key"), None)  # the anthropic package's
            header = b"Bearer " + key if key is not None else None
        problem = self.keys.check(bearer(header.decode("latin-1") if header is not None else None))
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = unauthorized(problem).response(path)
        response.headers["www-authenticate"] = "Bearer"
        await response(scope, receive, send)

"""``POST /v1/messages``: the body translated to a chat request (``to_chat.py``), run by the chat front's
machinery (checks, tools, reasoning, stop strings, cancellation, metrics, tracing), answered as Anthropic's
message or its events (``render.py``). Its id is ``msg_<hex>`` (``msg_<X-Request-Id>``). Every error has
Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, with the status the chat front gives
it (``errors.anthropic_response``: ``invalid_request_error`` 400, ``authentication_error`` 401,
``not_found_error`` 404, ``rate_limit_error`` 429, ``overloaded_error`` 503, ``api_error`` otherwise), the
middlewares' and the app's handlers' too (they shape by the path)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response

from services.common.errors import ServiceError
from services.engine.errors import InvalidRequestError
from services.gateway.generation import PreparedRequest
from services.gateway.openai.chat_request import ChatRequest
from services.gateway.openai.errors import OpenAIError, anthropic_response, from_gateway, param_of
from services.gateway.openai.event_stream import respond
from services.gateway.openai.messages_api.render import MessageEvents, MessageRender
from services.gateway.openai.messages_api.to_chat import MessagesBody, NamedError, anthropic_param, chat_body_of
from services.gateway.openai.request_ids import echoed, request_id_of
from services.gateway.openai.running import RunningRequest
from services.gateway.openai.translate import chat_input

if TYPE_CHECKING:
    from services.gateway.openai.app import Generations


def _renamed(error: OpenAIError) -> JSONResponse:
    """The chat front's error, its param named as Anthropic's body names it."""
    message, param = error.detail.message, error.detail.param
    ours = anthropic_param(param)
    if param is not None and ours is not None and message.startswith(param):
        message = ours + message[len(param):]
    return anthropic_response(error.status, message)


def add_messages_route(app: FastAPI, generations: Generations) -> None:
    """``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (the prompt's tokens, as the message would
    be templated: ``{"input_tokens": n}``; no node is called)."""

    async def answered(handler: Callable[[Request, Generations], Awaitable[Response]], request: Request
                       ) -> Response:
        try:
            return await handler(request, generations)
        except NamedError as error:
            return anthropic_response(error.status, error.detail.message)
        except OpenAIError as error:
            return _renamed(error)
        except (InvalidRequestError, ServiceError) as error:
            return _renamed(from_gateway(error))

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await answered(_messages, request)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await answered(_count_tokens, request)


async def _count_tokens(request: Request, generations: Generations) -> Response:
    body = await _body(request, max_tokens=1)  # count_tokens takes no max_tokens
    chat = chat_body_of(body)
    generations.check(chat)
    templated = chat_input(chat, "count_tokens", generations.parsers)
    ids = await generations.core.encode_prompt(None, list(templated.messages or ()), templated.tools,
                                               templated.template)
    return JSONResponse({"input_tokens": len(ids)})


async def _body(request: Request, **defaults: object) -> MessagesBody:
    try:
        raw = await request.json()
    except (ValueError, RecursionError) as error:  # RecursionError: nesting too deep for the parser
        raise NamedError(400, f"malformed JSON body: {type(error).__name__}: {error}"[:300]) from None
    if not isinstance(raw, dict):
        raise NamedError(400, f"the body must be a JSON object, got {type(raw).__name__}")
    try:
        return MessagesBody.model_validate({**defaults, **raw})
    except ValidationError as error:
        first = error.errors()[0]
        param = param_of(tuple(first.get("loc", ()))) or "request body"
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise NamedError(400, f"{param}: {message}", param=param) from None


async def _messages(request: Request, generations: Generations) -> Response:
    model_name, parsers = generations.settings.model_name, generations.parsers
    body = await _body(request)
    chat = chat_body_of(body)
    generations.check(chat)
    request_id, echo = request_id_of(request, "msg", "_")
    run = ChatRequest.of(chat, request_id, parsers)

    def render(index: int, prepared: PreparedRequest) -> MessageRender:
        return MessageRender(request_id, body.model or model_name, run.split_for(prepared), len(prepared.prompt_ids))

    async def answer(choices: Sequence[tuple[RunningRequest, MessageRender]]) -> Response:
        ((running, renderer),) = choices
        return await respond(running, MessageEvents(renderer), body.stream)

    return echoed(await generations.run(request, [run.generate], render, chat, run.constraint_param,
                                        answer=answer), echo)

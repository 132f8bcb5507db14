"""The routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/completions``,
``POST /v1/chat/completions``, ``POST /v1/responses`` (``responses_api/``), Anthropic's ``POST /v1/messages``
(``messages_api/``), ``GET /health`` (200, or 503 while draining), and ``POST /tokenize`` /
``POST /detokenize`` (``tokenize.py``).

Middlewares, outermost first: ``BodyLimit`` (framing and size, before any body is read), ``ApiKeyAuth``
(``Authorization: Bearer``, or ``x-api-key`` on ``/v1/messages``, on the API paths when keys are configured).

Each generation request is checked (model, schema), translated to a ``GenerateInput`` whose request id is
the response's ``id`` (``cmpl-…`` / ``chatcmpl-…`` / ``resp_…`` / ``msg_…``, also in the gateway's logs and
the trace), opened on the gateway's core and answered by ``streaming.respond`` (the Responses and Messages
APIs: ``event_stream.respond``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import structlog
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from services.engine.errors import InvalidRequestError
from services.engine.tokenizer import Tokenizer
from services.gateway.api_keys import ApiKeys
from services.gateway.core import GatewayCore
from services.gateway.generation import GenerateInput, PreparedRequest
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai import errors
from services.gateway.openai.auth import ApiKeyAuth
from services.gateway.openai.body_limit import BodyLimit
from services.gateway.openai.chat_request import ChatRequest
from services.gateway.openai.embeddings import add_embeddings_route
from services.gateway.openai.logprobs_render import LogprobsRender
from services.gateway.openai.messages_api.route import add_messages_route
from services.gateway.openai.parsers import FrontParsers, resolve_parsers
from services.gateway.openai.request_ids import echoed, request_id_of
from services.gateway.openai.responses import ModelCard, ModelList
from services.gateway.openai.responses_api.route import add_responses_route
from services.gateway.openai.running import RequestGroup, RunningRequest
from services.gateway.openai.schemas import ChatCompletionBody, CompletionBody, GenerationBody
from services.gateway.openai.streaming import respond
from services.gateway.openai.structured import renamed_error
from services.gateway.openai.tokenize import add_tokenize_routes
from services.gateway.openai.translate import (
    ChatRenderer,
    CompletionRenderer,
    Identity,
    PromptShown,
    Renderer,
    choices_of,
    completion_inputs,
)
from services.gateway.openai.unsupported import refuse_unsupported

R = TypeVar("R")  # what renders one choice: a Renderer for streaming.respond, else the answer's own

_QUANTIZATION = re.compile(r"[.-](I?Q\d\w*|F16|F32|BF16)$", re.IGNORECASE)

log = structlog.get_logger(__name__)


def served_model_id(path: Path) -> str:
    """``…/SmolLM2-135M-Instruct.Q4_1.gguf`` → ``SmolLM2-135M-Instruct``; a directory → its name."""
    name = path.name.removesuffix(".gguf") if path.suffix == ".gguf" else path.name
    return _QUANTIZATION.sub("", name)


@dataclass(frozen=True)
class FrontSettings:
    model_name: str  # the id /v1/models lists and requests must name
    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 30.0  # 0 = no limit
    api_keys: ApiKeys | None = None  # the keys /v1/*, /tokenize and /detokenize need (None: open)
    tool_call_parser: str = "auto"  # --tool-call-parser (config.TOOL_CALL_PARSERS)
    reasoning_parser: str = ""  # --reasoning-parser (config.REASONING_PARSERS; "": none)
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class FrontState:
    draining: bool = False  # new generation requests get 503


def create_app(core: GatewayCore, metrics: GatewayMetrics | None, settings: FrontSettings,
               state: FrontState | None = None) -> FastAPI:
    """Raises ``ValueError`` naming ``--tool-call-parser`` / ``--reasoning-parser`` when that parser cannot
    serve the model (a reasoning end marker that is not one token of its vocabulary)."""
    state = state or FrontState()
    parsers = resolve_parsers(settings.tool_call_parser, settings.reasoning_parser, core.tokenizer)
    app = FastAPI(title="pdserve", summary="OpenAI-compatible API of the pdserve gateway", docs_url=None,
                  redoc_url=None)
    errors.install(app)
    if settings.api_keys is not None and settings.api_keys.enabled:
        app.add_middleware(ApiKeyAuth, keys=settings.api_keys)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s)
    _add_info_routes(app, settings, state)
    generations = Generations(core, metrics, settings, state, parsers)
    _add_generation_routes(app, generations)
    add_responses_route(app, generations)
    add_messages_route(app, generations)
    add_tokenize_routes(app, core, settings.model_name, parsers)
    add_embeddings_route(app, core, settings.model_name, lambda: state.draining)
    return app


class Generations:
    """What the completion routes share: the checks of a request and running its choices."""

    def __init__(self, core: GatewayCore, metrics: GatewayMetrics | None, settings: FrontSettings,
                 state: FrontState, parsers: FrontParsers) -> None:
        self.core, self.metrics, self.settings, self.state = core, metrics, settings, state
        self.parsers = parsers

    def check(self, body: GenerationBody) -> None:
        if self.state.draining:
            raise errors.draining()
        if body.model is not None and body.model != self.settings.model_name:
            raise errors.model_not_found(body.model, self.settings.model_name)
        refuse_unsupported(body.model_extra)
        if body.stream_options is not None:
            refuse_unsupported(body.stream_options.model_extra, prefix="stream_options.")

    async def tokenized_once(self, prompts: list[GenerateInput]) -> list[GenerateInput]:
        """Each prompt as the token ids it templates and tokenizes to, so its ``n`` choices do not redo that;
        every prompt of a batch is checked before any request is opened (and counted). A single prompt
        that fails is left as it is: its first choice fails as a lone request would."""
        inputs = []
        for p, prepared in enumerate(await self.core.prepare_each_off_loop(prompts)):
            if isinstance(prepared, InvalidRequestError):
                if len(prompts) == 1:
                    return prompts
                raise InvalidRequestError(prepared.field, f"prompt {p} of the batch: {prepared.message}")
            inputs.append(dataclasses.replace(prompts[p], prompt=None, messages=None, token_ids=prepared.prompt_ids,
                                              prompt_reasoning=prepared.prompt_reasoning))  # the ids cannot tell
        return inputs

    async def run(self, request: Request, prompts: list[GenerateInput],
                  renderer: Callable[[int, PreparedRequest], R], body: GenerationBody,
                  constraint_param: str | None = None,
                  answer: Callable[[list[tuple[RunningRequest, R]]], Awaitable[Response]] | None = None
                  ) -> Response:
        """``prompts``: one input per prompt (a completions batch has several); ``renderer(i, prepared)``: the
        renderer of choice ``i``, prepared as ``prepared``; ``constraint_param``: what a refused constraint
        that is not the body's ``response_format`` / ``guided_*`` is named (``tools``: a forced call's grammar);
        ``answer``: what answers the opened choices (None: ``streaming.respond``, with ``Renderer``s)."""
        group = RequestGroup(request.receive)
        choices: list[tuple[RunningRequest, R]] = []

        async def open_all(prompts: list[GenerateInput]) -> None:
            if len(prompts) > 1 or body.n > 1:
                prompts = await self.tokenized_once(prompts)
            for i, one in enumerate(choices_of(prompts, body.n)):
                running = RunningRequest(self.core, self.metrics, one, request.headers.items(), group)
                await running.open()
                assert running.flow is not None
                choices.append((running, renderer(i, running.flow.request)))

        def close_all(error: BaseException) -> None:
            for running, _ in choices:
                running.close(error)  # a stream that started closes itself when it ends
            group.closed()

        try:
            if await group.unless_gone(open_all(prompts)):  # a long prompt may wait for a thread
                if answer is not None:
                    return await answer(choices)
                return await respond(choices, body.stream, body.include_usage, body.n, body.continuous_usage)
        except BaseException as error:
            close_all(error)
            renamed = renamed_error(body, error, constraint_param)  # a refused constraint, named as the body has it
            if renamed is None:
                raise
            raise renamed from error
        log.info("HTTP client disconnected before its request was opened")
        close_all(asyncio.CancelledError("client disconnected"))
        return Response(status_code=499)  # nobody reads it (nginx's "client closed request")


def _add_info_routes(app: FastAPI, settings: FrontSettings, state: FrontState) -> None:
    """``/health`` and the model list."""
    card = ModelCard(id=settings.model_name, created=settings.created)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "draining" if state.draining else "ok"}, status_code=503 if state.draining
                            else 200)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[card])

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> ModelCard:
        if model != settings.model_name:
            raise errors.model_not_found(model, settings.model_name)
        return card


def _add_generation_routes(app: FastAPI, generations: Generations) -> None:
    """``/v1/completions`` and ``/v1/chat/completions``."""
    core, model_name, parsers = generations.core, generations.settings.model_name, generations.parsers

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Response:
        generations.check(body)
        request_id, echo = request_id_of(request, "cmpl")
        who = Identity.new(request_id, model_name)

        def renderer(index: int, prepared: PreparedRequest) -> Renderer:
            as_ids = body.return_tokens_as_token_ids
            logprobs = LogprobsRender(core.tokenizer, as_ids) if body.logprobs is not None else None
            sent = list(prepared.prompt_ids) if prepared.prompt_cut else body.prompt[index // body.n]
            echo_text = echo_of(sent, core.tokenizer) if body.echo else None  # a truncated prompt: what was kept
            shown = PromptShown(prepared.prompt_ids, LogprobsRender(core.tokenizer, as_ids), echo_text,
                                body.logprobs if body.echo else None, body.prompt_logprobs) \
                if body.echo or body.prompt_logprobs is not None else None
            return CompletionRenderer(who, logprobs, index, shown)

        inputs = completion_inputs(body, request_id, parsers.reasoning_end_ids)
        return echoed(await generations.run(request, inputs, renderer, body), echo)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionBody, request: Request) -> Response:
        generations.check(body)
        request_id, echo = request_id_of(request, "chatcmpl")
        who = Identity.new(request_id, model_name)

        chat = ChatRequest.of(body, request_id, parsers)

        def renderer(index: int, prepared: PreparedRequest) -> Renderer:
            as_ids = body.return_tokens_as_token_ids
            logprobs = LogprobsRender(core.tokenizer, as_ids) if body.logprobs else None
            shown = PromptShown(prepared.prompt_ids, LogprobsRender(core.tokenizer, as_ids),
                                prompt_logprobs=body.prompt_logprobs) if body.prompt_logprobs is not None else None
            return ChatRenderer(who, logprobs, index, chat.split_for(prepared), shown)

        return echoed(await generations.run(request, [chat.generate], renderer, body, chat.constraint_param), echo)


def echo_of(prompt: str | list[int], tokenizer: Tokenizer) -> str:
    """An echoed prompt's text (vLLM's): the string as sent, or the text of the token ids, special tokens
    included (each token's bytes in order, as the logprobs' offsets count them)."""
    return prompt if isinstance(prompt, str) else tokenizer.decode(prompt, skip_special_tokens=False)

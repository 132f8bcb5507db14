"""``POST /v1/responses``: the body translated to a chat request (``to_chat.py``), run by the chat front's
machinery (checks, tools, structured output, reasoning, cancellation, metrics, tracing), answered as a
Responses object or its events (``render.py``). Its id is ``resp_<X-Request-Id>`` or ``resp_<hex>``.

Logprobs (``include: ["message.output_text.logprobs"]``, ``top_logprobs`` alternatives each) are the output
text's when it is the whole output: they are refused (400 naming ``include``) where the front has a reasoning
parser or the request offers tools, whose tokens are not the text's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from starlette.responses import Response

from services.engine.errors import InvalidRequestError
from services.gateway.generation import PreparedRequest
from services.gateway.openai.chat_request import ChatRequest
from services.gateway.openai.errors import OpenAIError
from services.gateway.openai.event_stream import respond
from services.gateway.openai.logprobs_render import LogprobsRender
from services.gateway.openai.request_ids import echoed, request_id_of
from services.gateway.openai.responses_api.body import OUTPUT_TEXT_LOGPROBS, ResponsesBody
from services.gateway.openai.responses_api.objects import ResponseObject
from services.gateway.openai.responses_api.render import ResponseEvents, ResponseRender
from services.gateway.openai.responses_api.to_chat import chat_body_of
from services.gateway.openai.running import RunningRequest

if TYPE_CHECKING:
    from services.gateway.openai.app import Generations


def add_responses_route(app: FastAPI, generations: Generations) -> None:
    core, model_name, parsers = generations.core, generations.settings.model_name, generations.parsers

    @app.post("/v1/responses")
    async def responses(body: ResponsesBody, request: Request) -> Response:
        translation = chat_body_of(body)
        chat = translation.body
        try:
            generations.check(chat)
            request_id, echo = request_id_of(request, "resp", "_")
            run = ChatRequest.of(chat, request_id, parsers)
            if chat.logprobs and (parsers.reasoning is not None or run.tools.offered):
                raise OpenAIError(400, f"include: {OUTPUT_TEXT_LOGPROBS} is supported only where the output is all "
                                       f"text: not with tools or a reasoning parser",
                                  param="include")
            shell = ResponseObject.of(body, request_id, model_name)

            def render(index: int, prepared: PreparedRequest) -> ResponseRender:
                logprobs = LogprobsRender(core.tokenizer, chat.return_tokens_as_token_ids) if chat.logprobs else None
                return ResponseRender(shell, run.split_for(prepared), logprobs, parsers.reasoning_end_ids)

            async def answer(choices: Sequence[tuple[RunningRequest, ResponseRender]]) -> Response:
                ((running, renderer),) = choices
                return await respond(running, ResponseEvents(renderer), body.stream)

            return echoed(await generations.run(request, [run.generate], render, chat, run.constraint_param,
                                                answer=answer), echo)
        except (OpenAIError, InvalidRequestError) as error:
            raise translation.renamed(error) from error

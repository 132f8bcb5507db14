"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's extensions): the served model's tokenizer and chat
template, as the gateway applies them to a request, without running anything on the nodes.

``/tokenize`` takes a ``prompt`` or chat ``messages`` (templated with the generation prompt, as
``/v1/chat/completions`` sends them: with its ``tools`` and ``tool_choice``, tool calls and tool results
included) and answers ``count``, ``max_model_len`` and ``tokens`` (with
``return_token_strs``, each token's string too). ``/detokenize`` takes ``tokens`` and answers ``prompt``.
Bad input is a 400 naming the field, as on the other endpoints.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.gateway.core import GatewayCore
from services.gateway.openai import errors
from services.gateway.openai.parsers import FrontParsers
from services.gateway.openai.schemas import ChatCompletionBody, ChatMessageBody
from services.gateway.openai.translate import chat_input
from services.gateway.openai.unsupported import refuse_unsupported


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # undeclared fields: checked by unsupported.refuse_unsupported

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageBody] | None = Field(None, min_length=1)
    tools: list[Any] | None = None  # checked as chat completions check them
    tool_choice: Any = None
    add_generation_prompt: Any = None  # the chat template's options, checked as chat completions check them
    continue_final_message: Any = None
    chat_template_kwargs: Any = None
    reasoning_effort: Any = None
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeBody(BaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


def add_tokenize_routes(app: FastAPI, core: GatewayCore, served_model: str, parsers: FrontParsers) -> None:
    def check_model(model: str | None) -> None:
        if model is not None and model != served_model:
            raise errors.model_not_found(model, served_model)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeBody) -> TokenizeResponse:
        check_model(body.model)
        refuse_unsupported(body.model_extra)
        if (body.model_extra or {}).get("truncate_prompt_tokens") is not None:  # generation's, not taken here
            raise errors.OpenAIError(400, "truncate_prompt_tokens: not taken by /tokenize (vLLM's neither)",
                                     param="truncate_prompt_tokens")
        if (body.prompt is None) == (body.messages is None):
            raise errors.OpenAIError(400, "give exactly one of prompt and messages", param="prompt")
        if body.messages is None:
            ids = await core.encode_prompt(body.prompt, None)  # InvalidRequestError: a 400 naming it
        else:
            try:
                chat = ChatCompletionBody.model_validate({
                    "messages": body.messages, "tools": body.tools, "tool_choice": body.tool_choice,
                    "add_generation_prompt": body.add_generation_prompt,
                    "continue_final_message": body.continue_final_message,
                    "chat_template_kwargs": body.chat_template_kwargs, "reasoning_effort": body.reasoning_effort})
            except ValidationError as error:  # a 400 naming the param, as the request body's own
                raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None
            templated = chat_input(chat, "tokenize", parsers)  # tool checks: a 400 naming the param
            ids = await core.encode_prompt(None, list(templated.messages or ()), templated.tools, templated.template)
        strings = core.tokenizer.hf.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=core.settings.max_model_len, tokens=ids,
                                token_strs=strings)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeBody) -> DetokenizeResponse:
        check_model(body.model)
        vocab = core.settings.vocab_size
        bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < vocab), None)
        if bad is not None:
            raise errors.OpenAIError(400, f"tokens[{bad}] = {body.tokens[bad]} is not a token id of this model "
                                          f"(vocabulary of {vocab})", param="tokens")
        return DetokenizeResponse(prompt=await core.decode(body.tokens))

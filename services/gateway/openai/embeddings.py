"""``POST /v1/embeddings`` (OpenAI's Embeddings API, as vLLM serves decoder embedding models): each input's
embedding is the final hidden state of its last token (last-token pooling, ``GatewayCore.embed``), L2-normalised,
computed on a prefill node alone.

- ``input``: a string, a list of strings, a list of token ids, or a list of such lists (at most
  :data:`MAX_INPUTS`); each runs as its own request, all at once (the prefill nodes batch them). An input that
  fails fails the request (400 naming ``input[i]``, or the node's status); the others are cancelled, as they all
  are when the client disconnects.
- ``encoding_format``: ``float`` (default) or ``base64`` (little-endian float32 bytes, as OpenAI sends them).
- ``dimensions``: the first that many values, normalised after (Matryoshka truncation, meaningful for models
  trained for it, such as Qwen3-Embedding); past the model's hidden size is a 400.
- vLLM's extensions: ``truncate_prompt_tokens`` (keep the last that many tokens; -1: the context's length),
  ``normalize`` (default true; false: the raw state) and ``add_special_tokens`` (default true: a text is tokenized
  with what the tokenizer adds to it, an embedding model's end-of-text token included).
- ``usage``: ``prompt_tokens`` = ``total_tokens``, every input's tokens.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from collections.abc import Callable
from typing import Literal

import structlog
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from services.engine.errors import InvalidRequestError
from services.gateway.core import GatewayCore
from services.gateway.embedding import Embedding, EmbedInput
from services.gateway.openai import errors
from services.gateway.openai.request_ids import echoed, request_id_of
from services.gateway.openai.running import RequestGroup
from services.gateway.openai.unsupported import refuse_unsupported

log = structlog.get_logger(__name__)
MAX_INPUTS = 2048  # OpenAI's limit of inputs in one request
INLINE_VALUES = 65536  # an answer of more values is encoded on a thread

Inputs = str | list[str] | list[int] | list[list[int]]


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # undeclared fields: checked by unsupported.refuse_unsupported

    model: str | None = None
    input: Inputs
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None  # taken and ignored, as by OpenAI's other endpoints here
    truncate_prompt_tokens: int | None = None
    normalize: bool = True
    add_special_tokens: bool = True


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage


def embed_inputs(body: EmbeddingBody) -> tuple[list[EmbedInput], bool]:
    """One :class:`EmbedInput` per input, in order, and whether the body gave one input alone (a string or one
    list of token ids, not a list of them); an empty list is a 400 naming ``input``."""
    given = body.input
    alone = isinstance(given, str) or bool(given and isinstance(given[0], int))
    if alone:
        given = [given]  # type: ignore[list-item]
    if not given or len(given) > MAX_INPUTS:
        raise errors.OpenAIError(400, f"input: must hold 1 to {MAX_INPUTS} inputs, got {len(given)}", param="input")
    options = dict(truncate_prompt_tokens=body.truncate_prompt_tokens, normalize=body.normalize,
                   dimensions=body.dimensions or 0, add_special_tokens=body.add_special_tokens)
    return [EmbedInput(prompt=one, **options) if isinstance(one, str) else EmbedInput(token_ids=one, **options)
            for one in given], alone


def encoded(values: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return values
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def add_embeddings_route(app: FastAPI, core: GatewayCore, served_model: str, is_draining: Callable[[], bool]
                         ) -> None:
    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingBody, request: Request) -> Response:
        if is_draining():
            raise errors.draining()
        if body.model is not None and body.model != served_model:
            raise errors.model_not_found(body.model, served_model)
        refuse_unsupported(body.model_extra)
        request_id, echo = request_id_of(request, "embd")
        inputs, alone = embed_inputs(body)
        results: list[Embedding] = []

        async def run() -> None:
            results.extend(await _embed_all(core, inputs, alone))

        group = RequestGroup(request.receive)  # a client that leaves cancels its inputs on the nodes
        try:
            if not await group.unless_gone(run()):
                log.info("HTTP client disconnected before its embeddings", request_id=request_id)
                return Response(status_code=499)  # nobody reads it (nginx's "client closed request")
        finally:
            group.closed()
        tokens = sum(r.prompt_tokens for r in results)

        def answer() -> str:
            return EmbeddingResponse(
                id=request_id, created=int(time.time()), model=served_model,
                data=[EmbeddingData(index=i, embedding=encoded(r.values, body.encoding_format))
                      for i, r in enumerate(results)],
                usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)).model_dump_json()

        values = sum(len(r.values) for r in results)  # thousands of inputs take the loop for seconds: a thread
        text = answer() if values <= INLINE_VALUES else await asyncio.to_thread(answer)
        return echoed(Response(text, media_type="application/json"), echo)


async def _embed_all(core: GatewayCore, inputs: list[EmbedInput], one_input: bool) -> list[Embedding]:
    """Every input's embedding; the first failure cancels the others and is raised (a 400 names its input)."""
    async def one(index: int, embed_input: EmbedInput) -> Embedding:
        try:
            return await core.embed(embed_input, None)
        except InvalidRequestError as error:
            if error.field in ("prompt", "token_ids"):
                param = "input" if one_input else f"input[{index}]"
                raise errors.OpenAIError(400, f"{param}: {error.message}", param=param) from None
            raise

    tasks = [asyncio.ensure_future(one(i, embed_input)) for i, embed_input in enumerate(inputs)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise

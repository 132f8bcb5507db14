"""The gateway's state across requests: validation, the in-flight registry, aborts, drain, cluster view.

``open()`` validates and tokenizes a request (``InvalidRequestError`` naming the field, before any node
is called; a long prompt on a worker thread, see ``tokenizing``), resolves its sampling (default
``max_tokens``, a random seed when none is given) and returns the ``RequestFlow`` that runs it. A request
id stays taken until every ``Abort`` its flow left behind has been answered, so a client reusing the id
never has its new request aborted by the old one's cleanup. An ``Abort`` that got no answer (the node hung
or died) cannot be waited for: such an id is remembered for ``UNANSWERED_TTL_S``, and a new request
reusing it runs under an id of its own on the nodes (``attempts.py``), out of reach of the old attempt's
cleanup should that node wake up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import structlog

from services.common import tracing
from services.common.errors import UnavailableError
from services.common.field_checks import MAX_CLIENT_REQUEST_ID_CHARS, check_request_id
from services.common.sampling_convert import default_max_tokens, random_seed
from services.engine.chat_template import DEFAULT_OPTIONS, PROMPT_CLOSED, ChatTemplateOptions
from services.engine.errors import DuplicateRequestError, InvalidRequestError
from services.engine.sampling_params import EMBEDDING_SAMPLING
from services.engine.tokenizer import ChatMessage, Tokenizer
from services.engine.validation import RequestValidator
from services.gateway import node_client
from services.gateway.directory import NodeDirectory
from services.gateway.embedding import Embedding, EmbedInput, pooled, run_on_a_prefill_node
from services.gateway.generation import GenerateInput, PreparedRequest
from services.gateway.nodes import NodeInfo
from services.gateway.request_flow import RequestFlow
from services.gateway.router import Router
from services.gateway.structured_check import StructuredChecks, engine_compiler
from services.gateway.tokenizing import INLINE_TOKENS, TokenizerThreads, all_tokenize_inline, tokenizes_inline

log = structlog.get_logger(__name__)
UNANSWERED_TTL_S = 600.0  # how long an id whose Abort got no answer runs fresh when reused
MAX_UNANSWERED = 65536


@dataclass(frozen=True)
class CoreSettings:
    max_model_len: int
    vocab_size: int
    max_tokens_cap: int = 256  # default max_tokens = min(cap, room left in the context)
    request_timeout_s: float = 0.0  # deadline of a call that has none; 0 = none
    abort_timeout_s: float = 2.0
    status_max_age_s: float = 1.0  # ClusterStatus polls again when the last poll is older
    retries_before_first_token: int = 1  # times a request whose node failed before its first token starts over
    resumes_after_first_token: int = 2  # times a request whose decode node failed after it goes on elsewhere
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)  # the model's generation config
    hidden_size: int = 0  # the model's: an embedding's values (0: unknown, ``dimensions`` not checked)


class GatewayCore:
    def __init__(self, tokenizer: Tokenizer, directory: NodeDirectory, settings: CoreSettings,
                 router: Router | None = None, recent_stall: Callable[[], float] = lambda: 0.0,
                 structured: StructuredChecks | None = None) -> None:
        """``recent_stall()``: seconds of a stall of this process's event loop that just ended (see
        ``LoopWatchdog.recent_stall_s``), so that a node call failing out of it is not blamed on the node.
        ``structured``: the content check of structured-output specs (default: the engine's compiler over
        ``tokenizer``)."""
        self.tokenizer = tokenizer
        self.recent_stall = recent_stall
        self.directory = directory
        self.router = router or Router()
        self.settings = settings
        self.validator = RequestValidator(settings.vocab_size, settings.max_model_len, tokenizer)
        self.draining = False
        self._taken: set[str] = set()  # request ids in flight or still being aborted
        self._unanswered: OrderedDict[str, float] = OrderedDict()  # node-level ids whose Abort got no answer
        self._flows: dict[str, RequestFlow] = {}
        self._embeddings: set[asyncio.Task[Any]] = set()  # Embed calls in flight (their handlers' tasks)
        self._drained: set[asyncio.Task[Any]] = set()  # those a drain cancelled past its grace
        self._background: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tokenizer_threads = TokenizerThreads()
        self.structured = structured or StructuredChecks(lambda: engine_compiler(tokenizer, settings.vocab_size))
        self.on_retry: Callable[[str], None] = lambda role: None  # the metrics count the retries, by failed role
        # the metrics count embeddings: (None, prompt tokens) when one is done, (the error, 0) when it failed
        self.on_embedded: Callable[[BaseException | None, int], None] = lambda error, tokens: None

    @property
    def in_flight(self) -> int:
        return len(self._flows) + len(self._embeddings)

    def tokenizing_pending(self) -> int:
        """Long prompts waiting for a tokenizing thread or being tokenized on one."""
        return self._tokenizer_threads.pending

    # --- requests ---

    def prepare(self, request: GenerateInput) -> PreparedRequest:
        """Tokenize and validate; raises ``InvalidRequestError`` (``InvalidArgumentError`` for a malformed
        client request id) naming the field. Changes nothing."""
        if request.request_id:  # the nodes refuse what is not an id (field_checks); say so before any work
            check_request_id(request.request_id, max_chars=MAX_CLIENT_REQUEST_ID_CHARS)
        keep_last = request.truncate_prompt_tokens
        if keep_last == -1:  # as vLLM: the context less what the request asks to generate
            keep_last = max(1, self.settings.max_model_len - (request.sampling.max_tokens or 1))
        ids = self.validator.encode_prompt(request.prompt, request.token_ids, request.messages, request.tools,
                                           request.template, keep_last)
        cap = default_max_tokens(len(ids), self.settings.max_model_len,
                                 max(self.settings.max_tokens_cap, request.sampling.min_tokens))
        fields = request.sampling.with_defaults(self.settings.sampling_defaults)
        sampling = fields.resolve(default_max_tokens=cap, default_seed=random_seed())
        reasoning = self._prompt_reasoning(request)
        spec = sampling.structured
        if reasoning == PROMPT_CLOSED and spec is not None and spec.starts_after_token_ids:  # no end marker will come
            sampling = dataclasses.replace(sampling, structured=dataclasses.replace(spec, starts_after_token_ids=()))
        self.validator.validate(ids, sampling)
        return PreparedRequest(request.request_id or uuid.uuid4().hex, tuple(ids), sampling, reasoning,
                               prompt_cut=keep_last is not None and len(ids) >= keep_last)

    def _prompt_reasoning(self, request: GenerateInput) -> str:
        """Did the chat prompt close the reasoning itself, or open it (``chat_template.prompt_reasoning``)?"""
        if request.prompt_reasoning is not None:
            return request.prompt_reasoning
        if request.reasoning_markers is None or not request.messages or self.tokenizer is None:
            return ""
        return self.tokenizer.prompt_reasoning(request.messages, request.tools, request.template,
                                               *request.reasoning_markers)

    async def prepare_off_loop(self, request: GenerateInput) -> PreparedRequest:
        """``prepare``, on a worker thread when the prompt is long (the event loop keeps serving)."""
        (prepared,) = await self.prepare_each_off_loop([request])
        if isinstance(prepared, InvalidRequestError):
            raise prepared
        return prepared

    async def prepare_each_off_loop(self, requests: Sequence[GenerateInput]
                                    ) -> list[PreparedRequest | InvalidRequestError]:
        """``prepare`` of each request up to the first that fails, whose error is then the last item (a
        batch's prompts: on one worker thread when they are long together); then the structured-output spec
        of each is compiled (``structured_check``: off the loop), again up to the first that fails."""
        def prepare_each() -> list[PreparedRequest | InvalidRequestError]:
            results: list[PreparedRequest | InvalidRequestError] = []
            for request in requests:
                try:
                    results.append(self.prepare(request))
                except InvalidRequestError as error:
                    results.append(error)
                    break
            return results

        with tracing.span("tokenize"):
            inline = (all_tokenize_inline((r.prompt, r.messages) for r in requests)  # bad words are tokenized too
                      and not any(r.tools or r.template.kwargs or r.sampling.bad_words for r in requests))
            results = await self._tokenizer_threads.run(prepare_each, inline=inline)
        return await self._check_structured(results)

    async def _check_structured(self, results: list[PreparedRequest | InvalidRequestError]
                                ) -> list[PreparedRequest | InvalidRequestError]:
        for i, prepared in enumerate(results):
            if isinstance(prepared, PreparedRequest) and prepared.sampling.structured is not None:
                try:
                    with tracing.span("structured_check"):
                        await self.structured.check(prepared.sampling.structured)
                except InvalidRequestError as error:
                    return [*results[:i], error]
        return results

    async def encode_prompt(self, prompt: str | None, messages: list[ChatMessage] | None,
                            tools: Sequence[Mapping[str, Any]] = (), template: ChatTemplateOptions = DEFAULT_OPTIONS
                            ) -> list[int]:
        """The validator's ``encode_prompt`` of a text or chat messages (with ``tools`` and ``template``'s options
        for the template), on a worker thread when long."""
        return await self._tokenizer_threads.run(
            lambda: self.validator.encode_prompt(prompt, None, messages, tools, template),
            inline=tokenizes_inline(prompt, messages, templated=bool(tools or template.kwargs)))

    async def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids``, on a worker thread when there are many."""
        return await self._tokenizer_threads.run(lambda: self.tokenizer.decode(token_ids),
                                                 inline=len(token_ids) <= INLINE_TOKENS)

    async def open(self, request: GenerateInput, time_remaining: float | None) -> RequestFlow:
        """A flow for a valid request (``time_remaining``: the client's deadline, None = none)."""
        self._refuse_if_draining()
        deadline = self._deadline(time_remaining)  # from the call's start: tokenizing counts against it
        try:
            prepared = await self.prepare_off_loop(request)
        except InvalidRequestError as error:  # the field and the reason, never the body (it may be megabytes)
            log.info("request rejected", request_id=request.request_id or None, field=error.field,
                     reason=_clipped(error.message))
            raise
        self._refuse_if_draining()  # the drain may have begun while a long prompt was tokenized
        if prepared.request_id in self._taken:
            raise DuplicateRequestError(prepared.request_id)
        flow = RequestFlow(prepared, directory=self.directory, router=self.router, tokenizer=self.tokenizer,
                           fresh_id=self._abort_unanswered(prepared.request_id),
                           deadline=deadline, abort=self.abort, on_close=self._closed, recent_stall=self.recent_stall,
                           retries=self.settings.retries_before_first_token, on_retry=lambda role: self.on_retry(role),
                           resumes=self.settings.resumes_after_first_token)
        self._taken.add(prepared.request_id)
        self._flows[prepared.request_id] = flow
        self._idle.clear()
        return flow

    async def embed(self, request: EmbedInput, time_remaining: float | None) -> Embedding:
        """One input's embedding (``embedding.py``): validated and tokenized here (``InvalidRequestError`` naming
        the field, before any node is called), run on a prefill node, pooled as asked. A drain lets it finish
        within the grace, then ends it ``UNAVAILABLE``. Counted (``on_embedded``) however it ends."""
        try:
            embedding = await self._embed(request, time_remaining)
        except BaseException as error:
            self.on_embedded(error, 0)
            raise
        self.on_embedded(None, embedding.prompt_tokens)
        return embedding

    async def _embed(self, request: EmbedInput, time_remaining: float | None) -> Embedding:
        self._refuse_if_draining()
        deadline = self._deadline(time_remaining)
        ids = await self._tokenizer_threads.run(lambda: self._embedding_prompt(request),
                                                inline=tokenizes_inline(request.prompt, None, templated=False))
        self._refuse_if_draining()
        task = asyncio.current_task()
        assert task is not None, "embed() runs in the call's task"
        self._embeddings.add(task)
        self._idle.clear()
        try:
            state, cached, address = await run_on_a_prefill_node(
                self.directory, self.router, ids, deadline, self.settings.retries_before_first_token,
                lambda role: self.on_retry(role))
        except asyncio.CancelledError:
            if task not in self._drained:
                raise
            task.uncancel()
            raise UnavailableError("gateway shutting down") from None
        finally:
            self._drained.discard(task)
            self._embeddings.discard(task)
            if not self._flows and not self._embeddings:
                self._idle.set()
        return Embedding(request.request_id or uuid.uuid4().hex, pooled(state, request.normalize, request.dimensions),
                         len(ids), cached, address)

    def _embedding_prompt(self, request: EmbedInput) -> list[int]:
        if request.request_id:
            check_request_id(request.request_id, max_chars=MAX_CLIENT_REQUEST_ID_CHARS)
        hidden = self.settings.hidden_size
        if request.dimensions < 0 or (hidden and request.dimensions > hidden):
            raise InvalidRequestError("dimensions", f"must be at most the model's {hidden} values, "
                                                    f"got {request.dimensions}")
        if (request.prompt is None) == (request.token_ids is None):
            raise InvalidRequestError("prompt", "exactly one of prompt and token_ids must be given")
        keep_last = request.truncate_prompt_tokens
        if keep_last == -1:
            keep_last = max(1, self.settings.max_model_len - 1)
        prompt, token_ids = request.prompt, request.token_ids
        if prompt is not None and not request.add_special_tokens:
            prompt, token_ids = None, self.tokenizer.encode_plain(prompt)
        ids = self.validator.encode_prompt(prompt, token_ids, None, keep_last=keep_last)
        self.validator.validate(ids, EMBEDDING_SAMPLING, prefill_only=True)
        return ids

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise UnavailableError("gateway is draining: not taking new requests")

    def _deadline(self, time_remaining: float | None) -> float | None:
        if time_remaining is None or time_remaining > 1e9:  # no client deadline
            if not self.settings.request_timeout_s:
                return None
            time_remaining = self.settings.request_timeout_s
        return time.monotonic() + time_remaining

    def _closed(self, flow: RequestFlow, aborts: Awaitable[None] | None) -> None:
        self._flows.pop(flow.request_id, None)
        if not self._flows and not self._embeddings:
            self._idle.set()
        if aborts is None:
            self._taken.discard(flow.request_id)
            return

        async def abort_then_forget() -> None:
            try:
                await aborts
            finally:
                self._taken.discard(flow.request_id)

        self._spawn(abort_then_forget())

    async def abort(self, role: str, address: str, request_id: str, reason: str) -> None:
        """Best-effort ``Abort`` on one node, bounded by ``abort_timeout_s``; failures are logged."""
        try:
            found = await node_client.abort(self.directory.stub(address), request_id, reason,
                                            timeout=self.settings.abort_timeout_s, metadata=tracing.outgoing())
        except grpc.aio.AioRpcError as error:
            log.warning("abort failed", node=address, role=role, request_id=request_id,
                        code=error.code().name, details=error.details())
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # no answer: the node may act on it later
                self._unanswered[request_id] = time.monotonic()  # (a dead one, refusing connections, cannot)
                self._unanswered.move_to_end(request_id)
                while len(self._unanswered) > MAX_UNANSWERED:
                    self._unanswered.popitem(last=False)
            return
        log.debug("aborted", node=address, role=role, request_id=request_id, found=found)

    def _abort_unanswered(self, request_id: str) -> bool:
        """An ``Abort`` of ``request_id`` got no answer lately: the node may still act on the old request."""
        now = time.monotonic()
        while self._unanswered and now - next(iter(self._unanswered.values())) > UNANSWERED_TTL_S:
            self._unanswered.popitem(last=False)
        return request_id in self._unanswered

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- cluster view ---

    async def cluster_status(self) -> list[NodeInfo]:
        await self.directory.refresh_if_older(self.settings.status_max_age_s)
        return self.directory.nodes()

    # --- shutdown ---

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests, give those in flight ``grace_s`` to finish, cancel the rest (their nodes get
        ``Abort``), and wait for the outstanding aborts."""
        self.draining = True
        log.info("gateway draining", in_flight=self.in_flight, grace_s=grace_s)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace_s)
        for flow in list(self._flows.values()):
            flow.cancel("gateway shutting down")
        for task in list(self._embeddings):
            self._drained.add(task)
            task.cancel()
        await self.wait_background()

    def close(self) -> None:
        """After the fronts stopped: the tokenizing threads go (anything later tokenizes on the loop)."""
        self._tokenizer_threads.close()
        self.structured.close()

    async def wait_background(self) -> None:
        """Wait for the aborts sent so far (each is bounded by ``abort_timeout_s``)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _clipped(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"

"""The mixed-mode engine: one process that prefills and decodes many requests together.

``step()`` is schedule → run → postprocess. Requests enter through :meth:`LLMEngine.add_request`, which
validates everything before any state changes; bad input raises :class:`InvalidRequestError`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.gated_delta import Save
from kernels.int4_linear import int4_supported
from kernels.signature import deterministic_kernels
from kvcache.hashing import model_fingerprint
from kvcache.kv_bytes import bytes_per_block, read_blocks, write_blocks
from kvcache.manager import KVCacheManager
from services.engine.admission import make_policy
from services.engine.adoption import Adoptions
from services.engine.config import EngineConfig
from services.engine.decode_graphs import Capture, CudaGraphCapture, GraphOptions
from services.engine.decode_role import DecodeRole
from services.engine.detokenizer import IncrementalDetokenizer
from services.engine.errors import DuplicateRequestError, InvalidRequestError, UnknownRequestError
from services.engine.handover import Handovers
from services.engine.kv_layout_spec import KVLayoutSpec
from services.engine.kv_offload import KVOffload
from services.engine.logprobs import TokenLogprobs
from services.engine.model.config import ModelConfig
from services.engine.model.decoder import DecoderModel, check_vocabulary
from services.engine.model.registry import model_class
from services.engine.model_runner import ModelRunner, StepSamples
from services.engine.output_cache import OutputCache
from services.engine.outputs import CompletedRequest, RequestOutput
from services.engine.prefill_handoff import Handoff
from services.engine.prefill_role import PrefillRole
from services.engine.recurrent_states import RecurrentStates
from services.engine.remote_store import RemoteBlockStore, RemoteStoreFactory
from services.engine.request import Request, RequestStatus
from services.engine.request_trace import end_trace
from services.engine.reservations import ReservationBook
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.state_checkpoints import StateCheckpoints
from services.engine.state_slots import StateSlots
from services.engine.stats import EngineStats
from services.engine.step_batch import SchedulerConfig, StepBatch
from services.engine.step_states import StepStates
from services.engine.structured.compiler import StructuredCompiler
from services.engine.structured.masking import GrammarMasker
from services.engine.structured.matcher import check_tokens
from services.engine.structured_spec import StructuredSpec
from services.engine.tokenizer import ChatMessage, Tokenizer
from services.engine.validation import RequestValidator
from services.engine.weights import load_weights
from services.engine.weights.digest import weights_digest

MAX_COUNTING_TOKENS = 2**21
"""The most tokens the blocks of a model without KV count, all sequences together: its pool costs no memory, but the
block pool and the prefix index keep an entry per block (~14 MiB and ~0.15 s to build for 2**17 blocks of 16). Past
them the scheduler preempts as it would for want of KV (128 sequences of 16k tokens fit)."""


def _blocks_in_budget(config: EngineConfig, cfg: ModelConfig, dtype_bytes: int) -> int:
    """The KV blocks ``kv_cache_gib`` holds, after a hybrid model's ``max_num_seqs`` recurrent-state slots and its
    state checkpoints (a budget they fill is refused naming the settings). A model without KV (``attention_free``)
    gets blocks of no bytes that only count tokens: enough for ``max_num_seqs`` sequences of ``max_model_len``, at most
    :data:`MAX_COUNTING_TOKENS` of them (its states are all the budget holds)."""
    budget = int(config.kv_cache_gib * 2**30)
    if cfg.recurrent is not None:
        count = config.max_num_seqs + config.num_state_checkpoints
        states = count * cfg.recurrent.state_bytes(dtype_bytes)
        if states >= budget:
            raise ValueError(f"kv_cache_gib {config.kv_cache_gib} does not hold the recurrent states of max_num_seqs "
                             f"{config.max_num_seqs} requests and {config.num_state_checkpoints} state_checkpoints "
                             f"({states / 2**30:.2f} GiB): raise the one or lower the others")
        budget -= states
    if cfg.attention_free:
        length = min(config.max_model_len or cfg.max_position, cfg.max_position)
        return min(-(-MAX_COUNTING_TOKENS // config.block_size), config.max_num_seqs * -(-length // config.block_size))
    return max(1, budget // (cfg.kv_bytes_per_token(dtype_bytes) * config.block_size))


@dataclass(frozen=True)
class PlannedStep:
    batch: StepBatch
    tables: dict[str, list[int]]
    state_slots: dict[str, int] | None = None  # a hybrid model's: each scheduled request's recurrent-state slot
    state_saves: tuple[Save, ...] = ()  # and the state checkpoints the step writes


class LLMEngine(PrefillRole, DecodeRole):
    """``remote_store``: how the node reaches the cache-store at ``config.offload_cache_store`` (needed when
    it is set): ``remote_store(address, self.kv_layout_spec())`` is called once for the KV offload and once
    more for the output cache, each getting a store (and a breaker) of its own. ``graph_capture``: how decode
    graphs are captured (default: CUDA graphs when ``config.cuda_graphs``; CPU tests pass
    ``decode_graphs.eager_capture``, which turns them on)."""

    def __init__(self, config: EngineConfig, model: DecoderModel, tokenizer: Tokenizer | None,
                 fingerprint_identity: dict[str, object] | None = None, *,
                 remote_store: RemoteStoreFactory | None = None, graph_capture: Capture | None = None):
        if config.offload_cache_store and remote_store is None:
            raise ValueError("offload_cache_store needs a remote_store factory (the node's cache-store client)")
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        cfg = model.config
        self.max_model_len = min(config.max_model_len or cfg.max_position, cfg.max_position)
        dtype_bytes = torch.finfo(model.dtype).bits // 8
        num_blocks = config.num_kv_blocks or _blocks_in_budget(config, cfg, dtype_bytes)
        if cfg.rope_length < min(self.max_model_len, num_blocks * config.block_size):
            raise ValueError(f"the model's rope tables hold {cfg.rope_length} positions, fewer than a sequence in a "
                             f"pool of {num_blocks} blocks of {config.block_size} may reach "
                             "(ModelConfig.served_within)")
        int4 = {"int4_max_rows": model.int4_max_rows} if model.int4_max_rows else {}
        if config.deterministic:  # other numerics: its KV is not a default node's, nor one of other kernels'
            int4["deterministic"] = deterministic_kernels(model.device)
        self.model_identity = dict(fingerprint_identity or {"model": cfg.name})  # NodeStatus reports it
        self.fingerprint = model_fingerprint(
            **self.model_identity, dtype=config.dtype, block_size=config.block_size,
            num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, **int4,
        )
        # a hybrid model's recurrent state cannot be rebuilt from KV blocks: prefix hits only as far as a state
        # checkpoint covers them (state_checkpoints.py), no kept KV (a preempted request is recomputed), no output
        # cache; each running request holds a state slot (state_slots.py)
        hybrid = cfg.has_recurrent_state
        self.state_slots = StateSlots() if hybrid else None
        checkpoints = config.num_state_checkpoints if hybrid else 0
        self.state_checkpoints = StateCheckpoints(checkpoints) if hybrid else None
        self.kv = KVCacheManager(num_blocks, config.block_size, self.fingerprint, config.enable_prefix_caching)
        self.runner = ModelRunner(model, num_blocks, config.block_size, config.attention_backend,
                                  deterministic=config.deterministic, graphs=self._graph_options(graph_capture),
                                  state_capacity=config.max_num_seqs, state_checkpoints=checkpoints)
        remote = None if hybrid else self._remote_store(remote_store)
        block_bytes = bytes_per_block(self.runner.kv_cache)
        self.offload = KVOffload(block_bytes, 0 if hybrid else int(config.offload_host_gib * 2**30), remote,
                                 fingerprint=self.fingerprint, remote_first=config.offload_remote == "always",
                                 staging_limit_bytes=num_blocks * block_bytes)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len,
                            prompt_blocks_only=config.deterministic), self.kv,
            admission=make_policy(config.admission), offloader=self.offload, checkpoints=self.state_checkpoints,
        )
        states = self.runner.states
        self.step_states = StepStates(states, self.state_slots, self.state_checkpoints, self.kv, self.scheduler) \
            if states is not None and self.state_slots is not None and self.state_checkpoints is not None else None
        self.eos_token_ids = tokenizer.eos_token_ids if tokenizer else cfg.eos_token_ids
        self.structured = StructuredCompiler(tokenizer, cfg.vocab_size) if tokenizer is not None else None
        self.grammar_masks = GrammarMasker(self.structured, cfg.vocab_size)
        self.validator = RequestValidator(cfg.vocab_size, self.max_model_len, tokenizer,
                                          kv_capacity_tokens=num_blocks * config.block_size,
                                          structured_check=self.check_structured, head_rows=cfg.output_vocab_size)
        self._requests: dict[str, Request] = {}
        self.held: dict[str, Request] = {}  # prefill role: handed off, KV blocks kept until released
        self._in_flight: set[str] = set()
        self._deferred_aborts: set[str] = set()
        self.reservations = ReservationBook(self.kv, self.scheduler)
        self.handovers = Handovers(self.scheduler, self.offload)
        self.adoptions = Adoptions(self.kv, self.scheduler, self.reservations)
        output_remote = self._remote_store(remote_store) if config.cache_outputs and not hybrid else None
        self.output_cache = OutputCache(output_remote, self.fingerprint, self.offload.bytes_per_block) \
            if output_remote is not None else None
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._handoffs: dict[str, Handoff] = {}  # prefill role (prefill_role.py)
        self._ids = itertools.count()

    def _graph_options(self, capture: Capture | None) -> GraphOptions | None:
        if capture is None and not self.config.cuda_graphs:
            return None
        return GraphOptions(self.config.max_num_seqs, self.max_model_len,
                            capture or CudaGraphCapture(self.model.device), self.config.attention_backend or "auto")

    def _remote_store(self, factory: RemoteStoreFactory | None) -> RemoteBlockStore | None:
        if not self.config.offload_cache_store or factory is None:
            return None
        return factory(self.config.offload_cache_store, self.kv_layout_spec())

    @classmethod
    def from_config(cls, config: EngineConfig, remote_store: RemoteStoreFactory | None = None) -> LLMEngine:
        """Load the model at ``config.model_path`` and build the engine (``remote_store``: see the class)."""
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        weights = load_weights(config.model_path, keep_q4=config.int4_max_rows > 0
                               and int4_supported(config.device, config.torch_dtype))
        model_type, model_config = model_class(weights.config.architecture), weights.config
        dtype_bytes = torch.finfo(config.torch_dtype).bits // 8
        kv_tokens = (config.num_kv_blocks or _blocks_in_budget(config, model_config, dtype_bytes)) * config.block_size
        served = model_config.served_within(config.max_model_len, kv_tokens)
        model = model_type(served, weights.tensors, config.torch_dtype,
                           config.device, quantized=weights.quantized, int4_max_rows=config.int4_max_rows,
                           deterministic=config.deterministic, fused_ops=config.fused_ops)
        tokenizer = Tokenizer.load(config.model_path, weights.config.eos_token_ids, config.trust_remote_code)
        check_vocabulary(weights.config, tokenizer.vocab_size)
        identity = {"model": weights.config.name, "weights": weights.digest or weights_digest(weights.source)}
        return cls(config, model, tokenizer, identity, remote_store=remote_store)

    def close(self) -> None:
        """Stop the offload's and the output cache's background threads and close their cache-store
        connections (after the last step: the engine is not used again)."""
        self.grammar_masks.close()
        self.offload.close()
        if self.output_cache is not None:
            self.output_cache.close()
            self.output_cache.remote.close()
        if self.offload.remote is not None:
            self.offload.remote.close()

    # ---- requests -----------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | None = None, token_ids: Sequence[int] | None = None,
                      messages: Sequence[ChatMessage] | None = None) -> list[int]:
        return self.validator.encode_prompt(prompt, token_ids, messages)

    def add_request(self, prompt: str | None = None, sampling: SamplingParams | None = None, *,
                    token_ids: Sequence[int] | None = None, messages: Sequence[ChatMessage] | None = None,
                    request_id: str | None = None, prefill_only: bool = False) -> Request:
        """Queue a request. With ``prefill_only`` (prefill role) it finishes as ``FINISHED_HANDED_OFF``
        after its first token, its KV blocks kept until :meth:`release`."""
        sampling = sampling or SamplingParams()
        request_id = request_id or f"req-{next(self._ids)}"
        self._check_new_id(request_id)
        ids = self.encode_prompt(prompt, token_ids, messages)
        bad_words = self.validator.validate(ids, sampling, prefill_only=prefill_only)
        request = Request(request_id, ids, sampling, eos_token_ids=self.eos_token_ids, prefill_only=prefill_only,
                          bad_word_ids=bad_words)
        self._requests[request_id] = request
        if self.tokenizer is not None:
            self._detokenizers[request_id] = IncrementalDetokenizer(
                self.tokenizer, sampling.stop, sampling.min_tokens, include_stop=sampling.include_stop_str_in_output,
                skip_special_tokens=sampling.skip_special_tokens)
        self.scheduler.add(request)
        return request

    def check_structured(self, spec: StructuredSpec, token_ids: Sequence[int] = (), field: str = "") -> None:
        """Raise :class:`InvalidRequestError` if ``spec`` does not compile here (``structured_output``), or
        if its grammar refuses ``token_ids`` (tokens made elsewhere: a prefill node's first token, a handed
        request's output; the error names ``field``). Compiled grammars are cached by the spec's key."""
        if self.structured is None:
            raise InvalidRequestError("structured_output", "this node has no tokenizer: constrained output "
                                                           "needs one")
        self.structured.check(spec)
        compiled = self.structured.compile(spec)  # cached by check
        if token_ids:
            check_tokens(compiled, token_ids, field, spec.starts_after_token_ids)

    def holds(self, request_id: str) -> bool:
        """The id is in use here: a request queued, running (an abort of one in the running step takes effect
        when the step ends), held for its KV transfer, or reserved."""
        return request_id in self._requests or request_id in self.held or request_id in self.reservations.reservations

    def _check_new_id(self, request_id: str) -> None:
        if self.holds(request_id):
            raise DuplicateRequestError(request_id)

    def abort(self, request_id: str) -> RequestOutput:
        """Finish a request wherever it is (queued, running, reserved, or held for transfer) and free
        everything it holds. Raises :class:`UnknownRequestError` if the engine does not hold it."""
        if request_id in self._in_flight:  # the running step writes its blocks: abort once it ended
            self._deferred_aborts.add(request_id)
            return RequestOutput(request_id, finished=True, finish_reason="abort")
        if self.reservations.cancel(request_id):
            return RequestOutput(request_id, finished=True, finish_reason="abort")
        if self.release(request_id):
            return RequestOutput(request_id, finished=True, finish_reason="abort")
        request = self._requests.get(request_id)
        if request is None:
            raise UnknownRequestError(f"no request {request_id!r}")
        self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        out = self._finish_output(request, RequestOutput(request_id))
        self._sweep_state_slots()
        return out

    def discard(self, request_id: str) -> bool:
        """:meth:`abort` for callers that do not mind whether the request is still here (idempotent)."""
        try:
            self.abort(request_id)
        except UnknownRequestError:
            return False
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the KV pool: bytes in and out of blocks a caller holds --------------------------------------
    @property
    def kv_pool(self) -> torch.Tensor:
        """The KV cache tensor ``[layers, blocks, 2, block_size, kv_heads, head_dim]`` (its device, a CUDA
        IPC export). Only blocks the caller holds may be read or written through it."""
        return self.runner.kv_cache

    @property
    def recurrent_states(self) -> RecurrentStates | None:
        """A hybrid model's recurrent states (``recurrent_states.py``); None for other models."""
        return self.runner.states

    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool."""
        return self.kv.num_blocks

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    def kv_layout_spec(self) -> KVLayoutSpec:
        """The layout of this engine's KV blocks (fixed at construction: no engine lock needed)."""
        cfg = self.model.config
        return KVLayoutSpec(dtype=self.config.dtype, block_size=self.kv.block_size, num_layers=len(cfg.kv_layers),
                            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, model_fingerprint=self.fingerprint,
                            bytes_per_block=bytes_per_block(self.runner.kv_cache))

    def read_kv_blocks(self, block_ids: Sequence[int]) -> bytes:
        """The KV bytes of ``block_ids`` in wire order. Needs no engine lock when the caller holds the
        blocks (a held request's, a reservation's): nothing else writes them."""
        return read_blocks(self.runner.kv_cache, block_ids)

    def write_kv_blocks(self, block_ids: Sequence[int], payload: bytes | memoryview) -> None:
        """Write ``payload`` (wire order, as :meth:`read_kv_blocks` gives it) into ``block_ids``, blocks the
        caller holds; no engine lock needed then."""
        write_blocks(self.runner.kv_cache, block_ids, payload)

    # ---- the loop -----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step: schedule → run the model → record the results."""
        planned = self.begin_step()
        if planned is None:
            return []
        return self.end_step(planned, self.execute_step(planned))

    def begin_step(self) -> PlannedStep | None:
        """Schedule the next batch (touches control state). Until :meth:`end_step`, aborts of requests in
        the batch are deferred, so no block the model is writing is freed under it."""
        batch = self.scheduler.schedule()
        if not batch:
            return None
        tables = {s.request.request_id: self.kv.block_ids(s.request.request_id) for s in batch.scheduled}
        self._in_flight = batch.request_ids
        if self.step_states is None:
            return PlannedStep(batch, tables)
        return PlannedStep(batch, tables, *self.step_states.plan(batch))

    def _sweep_state_slots(self) -> None:
        """Free the state slots of requests no longer running (a hybrid model's; ``step_states.py``)."""
        if self.step_states is not None:
            self.step_states.sweep()

    def execute_step(self, planned: PlannedStep) -> StepSamples:
        """Copy preempted KV out and resumed KV in, then run the model for a planned batch. Reads no
        control state: reservations, commits and aborts may happen meanwhile (from another thread, under
        the caller's lock). The token masks of constrained requests are filled while the model runs."""
        batch = planned.batch
        self.grammar_masks.start([s.request for s in batch.scheduled if s.samples])
        self.offload.copy_out(self.runner.kv_cache, batch.swap_out)  # before anything writes those blocks
        self.offload.copy_in(self.runner.kv_cache, batch.swap_in)
        if not batch.scheduled:
            return StepSamples()
        return self.runner.execute(batch, planned.tables, planned.state_slots, planned.state_saves)

    def end_step(self, planned: PlannedStep, sampled: StepSamples) -> list[RequestOutput]:
        self.scheduler.release_swapped(planned.batch)
        self.offload.reclaim()
        for item in planned.batch.scheduled:  # finish as "stop" once nothing more may follow
            item.request.grammar_complete = item.request.request_id in sampled.completed
            item.request.prompt_logprobs += sampled.prompt_logprobs.get(item.request.request_id, ())
        advanced = self.scheduler.update(planned.batch, sampled.tokens)
        self._in_flight = set()
        outputs = [self._output(r, sampled.logprobs.get(r.request_id), sampled.embeddings.get(r.request_id),
                                self.step_states.handed_off(r) if self.step_states is not None else None)
                   for r in advanced]
        self._sweep_state_slots()
        deferred, self._deferred_aborts = self._deferred_aborts | set(sampled.grammar_errors), set()
        for request_id in deferred:
            with contextlib.suppress(UnknownRequestError):
                aborted = self.abort(request_id)
                if request_id in sampled.grammar_errors:
                    aborted.abort_reason = f"structured output: {sampled.grammar_errors[request_id]}"
                outputs.append(aborted)
        return outputs

    def _output(self, request: Request, logprobs: TokenLogprobs | None = None,
                embedding: list[float] | None = None, recurrent_state: bytes | None = None) -> RequestOutput:
        """``embedding``: an embedding request's, sampled in the same step as its one token."""
        token = request.output_token_ids[-1]
        out = RequestOutput(request.request_id, new_token_ids=[token], new_logprobs=[logprobs] if logprobs else [],
                            embedding=embedding, recurrent_state=recurrent_state)
        if request.num_output_tokens == 1 and request.sampling.prompt_logprobs is not None:
            out.prompt_logprobs, request.prompt_logprobs = request.prompt_logprobs, []  # with the first token
        detok = self._detokenizers.get(request.request_id)
        if detok is not None:
            ended_by_token = request.status is RequestStatus.FINISHED_STOPPED and isinstance(request.stop_reason, int)
            out.new_text = detok.push([token], ends_on_stop_token=ended_by_token)
            if detok.matched_stop is not None and not request.status.finished:
                request.stop_reason = detok.matched_stop
                self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
        if request.status.finished:
            self._finish_output(request, out)
        return out

    def _finish_output(self, request: Request, out: RequestOutput) -> RequestOutput:
        detok = self._detokenizers.pop(request.request_id, None)
        if detok is not None:
            out.new_text += detok.flush()
            if detok.matched_stop is not None and request.status is RequestStatus.FINISHED_LENGTH:
                # the token that reached max_tokens completed a stop string: a stop, as the gateway reports it
                request.stop_reason = detok.matched_stop
                request.transition(RequestStatus.FINISHED_STOPPED)
        end_trace(request)
        if request.status is RequestStatus.FINISHED_HANDED_OFF:
            self.held[request.request_id] = request
        if self.output_cache is not None:  # its blocks were just freed into the prefix index
            self.output_cache.capture(request, self.kv, self.runner.kv_cache)
        out.finished = True
        out.finish_reason = request.finish_reason
        out.stop_reason = request.stop_reason
        out.prompt_tokens = request.num_prompt_tokens
        out.completion_tokens = request.num_output_tokens
        out.cached_tokens = request.num_cached_tokens
        self._requests.pop(request.request_id, None)
        return out

    def generate(self, prompts: Sequence[str | Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
                 | None = None) -> list[CompletedRequest]:
        """Run prompts (text or token ids) together to completion; results in input order."""
        params = sampling if isinstance(sampling, Sequence) else [sampling or SamplingParams()] * len(prompts)
        order = []
        for prompt, sp in zip(prompts, params, strict=True):
            if isinstance(prompt, str):
                order.append(self.add_request(prompt, sp))
            else:
                order.append(self.add_request(sampling=sp, token_ids=prompt))
        texts = {r.request_id: "" for r in order}
        logprobs: dict[str, list[TokenLogprobs]] = {r.request_id: [] for r in order}
        prompt_logprobs: dict[str, list[TokenLogprobs]] = {r.request_id: [] for r in order}
        while self.has_unfinished():
            for out in self.step():
                texts[out.request_id] += out.new_text
                logprobs[out.request_id] += out.new_logprobs
                prompt_logprobs[out.request_id] += out.prompt_logprobs
        return [CompletedRequest(r.request_id, r.prompt_token_ids, list(r.output_token_ids), texts[r.request_id],
                                 r.finish_reason, r.num_cached_tokens, r.stop_reason, logprobs[r.request_id],
                                 prompt_logprobs[r.request_id])
                for r in order]

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        if self.step_states is not None:
            self.step_states.check_integrity()

    # ---- status -------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters and gauges (call under the engine lock: on its thread)."""
        pool, sched, offload, policy = self.kv.pool, self.scheduler.stats, self.offload, self.scheduler.admission
        cache, checkpoints = self.output_cache, self.state_checkpoints
        return EngineStats(
            requests_total=sched.requests_admitted_total, prompt_tokens_total=sched.prompt_tokens_total,
            generated_tokens_total=sched.generated_tokens_total,
            prefix_hit_requests_total=sched.prefix_hit_requests_total,
            prefix_hit_tokens_total=sched.prefix_hit_tokens_total, preemptions_total=sched.preemptions_total,
            offloads_total=sched.offloads_total, resumes_total=sched.resumes_total,
            recomputes_total=sched.recomputes_total, requests_running=len(self.scheduler.running),
            requests_waiting=len(self.scheduler.waiting),
            kv_layout=self.kv_layout_spec(), block_size=self.kv.block_size, blocks_total=self.kv.num_blocks,
            blocks_free=pool.num_free_blocks - pool.num_cached_blocks, blocks_cached=pool.num_cached_blocks,
            blocks_reserved=self.reservations.num_reserved_blocks, evictions_total=pool.num_evictions,
            kv_bytes_total=self.runner.kv_cache_bytes,
            admission_policy=policy.name, admission_headroom_blocks=self.scheduler.headroom_blocks(),
            new_token_ratio=getattr(policy, "ratio", 0.0),
            offloaded_bytes_total=offload.stats.offloaded_bytes_total,
            offloaded_remote_bytes_total=offload.stats.offloaded_remote_bytes_total,
            offload_host_bytes_used=offload.host_bytes_held,
            store_fetched_bytes_total=offload.stats.fetched_remote_bytes_total
            + self.adoptions.stats.fetched_bytes_total,
            store_written_blocks_total=cache.stats.written_blocks_total if cache is not None else 0,
            store_breaker_trips_total=(offload.remote.trips_total if offload.remote is not None else 0)
            + (cache.remote.trips_total if cache is not None else 0),
            handovers_out_total=self.handovers.stats.handovers_out_total,
            handovers_in_total=self.adoptions.stats.handovers_in_total,
            state_checkpoints_total=checkpoints.capacity if checkpoints is not None else 0,
            state_checkpoints_used=len(checkpoints) if checkpoints is not None else 0,
            state_checkpoint_saves_total=checkpoints.saves_total if checkpoints is not None else 0,
            state_checkpoint_hits_total=checkpoints.hits_total if checkpoints is not None else 0,
            state_bytes_total=self.runner.states.nbytes if self.runner.states is not None else 0,
            model_name=str(self.model_identity.get("model", "")),
            weights_digest=str(self.model_identity.get("weights", "")), deterministic=self.config.deterministic,
        )

"""Continuous batching with a per-step token budget, chunked prefill and prefix caching.

Each step: running requests first (in admission order; a decode needs one token, an unfinished prefill
gets the next chunk), then waiting requests in arrival order while budget, batch slots and KV blocks allow.
A waiting request is admitted only if the free pool, after what running prefills are still owed, covers
its whole remaining prompt plus its first decode token, so admitted prefills can always finish. When a
running request cannot get a block, the most recently admitted *decoding* request is preempted (KV
freed; it resumes by recompute, helped by whatever of its blocks the prefix cache still holds). Prefill
requests are never victims.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvcache.manager import KVCacheManager, PrefixMatch
from services.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 1024
    max_model_len: int = 8192


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    start: int  # num_computed_tokens when scheduled

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the request's tokens, so its last position samples."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerStats:
    prompt_tokens_total: int = 0
    prefix_hit_tokens_total: int = 0
    prefix_hit_requests_total: int = 0
    requests_admitted_total: int = 0
    preemptions_total: int = 0


@dataclass
class StepBatch:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self.stats = SchedulerStats()
        self._admissions = itertools.count()

    # ---- queue management -------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request, status: RequestStatus, keep_blocks: bool = False) -> None:
        """Move a request to a finished state and release everything it holds (its KV blocks stay
        allocated under its id when ``keep_blocks``: the caller frees them later)."""
        assert status.finished, f"{status} is not a finished state"
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if not keep_blocks and self.kv.has_request(request.request_id):
            self.kv.free(request.request_id)
        request.transition(status)

    def add_prefilled(self, request: Request) -> None:
        """Admit straight into decoding a request whose prompt KV already fills its blocks (received from a
        prefill node) and whose first token is appended."""
        assert self.kv.has_request(request.request_id), f"{request.request_id} holds no blocks"
        assert request.num_output_tokens == 1 and request.num_computed_tokens == request.num_prompt_tokens
        request.admitted_seq = next(self._admissions)
        request.transition(RequestStatus.RUNNING_DECODE)
        self.running.append(request)
        self.stats.requests_admitted_total += 1
        self.stats.prompt_tokens_total += request.num_prompt_tokens
        self.stats.prefix_hit_tokens_total += request.num_cached_tokens
        self.stats.prefix_hit_requests_total += request.num_cached_tokens > 0

    # ---- one step ---------------------------------------------------------------------------------
    def schedule(self) -> StepBatch:
        batch = StepBatch()
        budget = self.config.max_num_batched_tokens
        for request in list(self.running):
            if budget == 0:
                break
            if request not in self.running:  # preempted earlier in this loop
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if self._grow(request, request.num_computed_tokens + num_new, batch):
                batch.scheduled.append(ScheduledRequest(request, num_new, request.num_computed_tokens))
                budget -= num_new
        if not batch.preempted:
            budget = self._admit_waiting(batch, budget)
        return batch

    def _grow(self, request: Request, num_tokens: int, batch: StepBatch) -> bool:
        while self.kv.allocate(request.request_id, num_tokens) is None:
            victim = self._pick_victim(exclude=batch.scheduled)
            if victim is None:
                return False
            self._preempt(victim, batch)
            if victim is request:
                return False
        return True

    def _pick_victim(self, exclude: Iterable[ScheduledRequest]) -> Request | None:
        """The most recently admitted decoding request not already scheduled this step."""
        busy = {s.request.request_id for s in exclude}
        decoding = [r for r in self.running
                    if r.status is RequestStatus.RUNNING_DECODE and r.request_id not in busy]
        return max(decoding, key=lambda r: r.admitted_seq, default=None)

    def _preempt(self, request: Request, batch: StepBatch) -> None:
        self.running.remove(request)
        self.kv.free(request.request_id)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.transition(RequestStatus.PREEMPTED)
        self.waiting.appendleft(request)
        self.stats.preemptions_total += 1
        batch.preempted.append(request)

    def _owed_to_prefills(self) -> int:
        owed = 0
        for r in self.running:
            if r.status is RequestStatus.RUNNING_PREFILL:
                owed += self.kv.blocks_needed(r.request_id, r.num_tokens + 1)
        return owed

    def _admit_waiting(self, batch: StepBatch, budget: int) -> int:
        owed = self._owed_to_prefills()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            prefix = self.kv.match_prefix(request.token_ids)
            needed = self.kv.blocks_needed(request.request_id, request.num_tokens + 1, prefix)
            if self.kv.num_free_blocks - owed < needed:
                break
            num_new = min(request.num_tokens - prefix.num_tokens, budget)
            if self.kv.allocate(request.request_id, prefix.num_tokens + num_new, prefix) is None:
                break
            self.waiting.popleft()
            self._admit(request, prefix)
            owed += self.kv.blocks_needed(request.request_id, request.num_tokens + 1)
            batch.scheduled.append(ScheduledRequest(request, num_new, request.num_computed_tokens))
            budget -= num_new
        return budget

    def _admit(self, request: Request, prefix: PrefixMatch) -> None:
        first_admission = request.status is RequestStatus.WAITING
        request.num_computed_tokens = prefix.num_tokens
        request.admitted_seq = next(self._admissions)
        request.transition(RequestStatus.RUNNING_PREFILL)
        self.running.append(request)
        if first_admission:
            request.num_cached_tokens = prefix.num_tokens
            self.stats.requests_admitted_total += 1
            self.stats.prompt_tokens_total += request.num_prompt_tokens
            self.stats.prefix_hit_tokens_total += prefix.num_tokens
            self.stats.prefix_hit_requests_total += prefix.num_tokens > 0

    # ---- after the model ran ----------------------------------------------------------------------
    def update(self, batch: StepBatch, sampled: dict[str, int]) -> list[Request]:
        """Record computed tokens and sampled ids; return requests that received a token this step."""
        advanced = []
        for item in batch.scheduled:
            request = item.request
            request.num_computed_tokens = item.start + item.num_new_tokens
            self.kv.cache_computed(request.request_id, request.token_ids, request.num_computed_tokens)
            if not item.samples:
                continue
            request.append_output(sampled[request.request_id])
            if request.status is RequestStatus.RUNNING_PREFILL:
                request.transition(RequestStatus.RUNNING_DECODE)
            advanced.append(request)
            status = self.stop_status(request)
            if status is not None:
                self.finish(request, status)
            elif request.prefill_only:
                self.finish(request, RequestStatus.FINISHED_HANDED_OFF, keep_blocks=True)
        return advanced

    def stop_status(self, request: Request) -> RequestStatus | None:
        """Token-level stop conditions after a new token was appended."""
        params = request.sampling
        token = request.output_token_ids[-1]
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in request.eos_token_ids:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

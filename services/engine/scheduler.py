"""Continuous batching with a per-step token budget, chunked prefill and prefix caching.

Each step: running requests first (in admission order; a decode needs one token, an unfinished prefill
gets the next chunk), then waiting requests in arrival order while budget, batch slots and KV blocks allow.
A waiting request is admitted only if the free pool, after what running prefills are still owed, covers
its whole remaining prompt plus its first decode token, so admitted prefills can always finish. When a
running request cannot get a block, the most recently admitted *decoding* request is preempted; prefill
requests are never victims. An :class:`AdmissionPolicy` (``admission.py``) keeps blocks back for the
decoding requests when new ones are admitted.

Preempted KV is kept when a :class:`KVOffloader` takes it: the victim's blocks stay allocated for one more
step, the engine copies them out while the step runs (``StepBatch.swap_out``) and frees them when it ends
(:meth:`Scheduler.release_swapped`); the request then waits at the head of the queue and resumes by
copying its KV back into fresh blocks (``StepBatch.swap_in``) — no recompute. While a copy comes back
from the cache-store the requests behind it may be admitted around it, from the free blocks its resume does
not need, so a slow store holds up only the requests whose KV it has. Without a copy (no offloader, or no
room in it) the blocks are freed at once and the request is recomputed on resume, helped by whatever of its
blocks the prefix cache still holds.

A hybrid model's prefix hit is good only as far as a checkpoint of its recurrent state covers it
(``state_checkpoints.py``): the scheduler admits with that part, and notes on the request where it checkpoints.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable

from kvcache.manager import KVCacheManager, PrefixMatch
from services.engine.admission import AdmissionPolicy, NoReservation, StepSignal
from services.engine.request import Request, RequestStatus
from services.engine.state_checkpoints import StateCheckpoints
from services.engine.step_batch import (
    KVOffloader,
    ScheduledRequest,
    SchedulerConfig,
    SchedulerStats,
    StepBatch,
    SwapIn,
    SwapOut,
)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, admission: AdmissionPolicy | None = None,
                 offloader: KVOffloader | None = None, checkpoints: StateCheckpoints | None = None):
        self.config = config
        self.kv = kv
        self.checkpoints = checkpoints  # a hybrid model's (prefix hits only as far as a checkpoint covers them)
        self.admission = admission or NoReservation()
        self.offloader = offloader
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self.stats = SchedulerStats()
        self._admissions = itertools.count()
        self._admitted_since_step = False  # add_prefilled between steps counts as an admission
        self._releasing_blocks = 0  # blocks of this step's swap-outs, free once the step ended
        self._owed = 0  # blocks running prefills still need for their prompt and first decode token

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
        if self.offloader is not None and request.status is RequestStatus.PREEMPTED:
            self.offloader.discard(request.request_id)
        request.transition(status)

    def add_prefilled(self, request: Request) -> None:
        """Admit straight into decoding a request whose prompt KV already fills its blocks (received from a
        prefill node) and whose first token is appended."""
        assert self.kv.has_request(request.request_id), f"{request.request_id} holds no blocks"
        assert request.num_output_tokens == 1 and request.num_computed_tokens == request.num_prompt_tokens
        request.admitted_seq = next(self._admissions)
        request.transition(RequestStatus.RUNNING_DECODE)
        self.running.append(request)
        self._admitted_since_step = True
        self._count_admission(request, request.num_cached_tokens)

    def add_adopted(self, request: Request) -> None:
        """Admit straight into decoding a request another decode node preempted and handed over: its blocks
        hold the KV of all its tokens but the last. Not counted as an admission (its first node did)."""
        assert self.kv.has_request(request.request_id), f"{request.request_id} holds no blocks"
        assert request.num_output_tokens >= 1 and request.num_computed_tokens == request.num_tokens - 1
        request.admitted_seq = next(self._admissions)
        request.transition(RequestStatus.RUNNING_DECODE)
        self.running.append(request)
        self._admitted_since_step = True

    def prefix_tokens(self, request: Request, limit: int | None = None) -> list[int]:
        """The tokens (of the first ``limit``) whose full blocks the prefix cache may serve ``request``: in the
        deterministic mode (``prompt_blocks_only``) its prompt's only — a block computed for output positions
        ran another kernel path than the same tokens as a prompt do (``kernels.linear.RowPaths``), so a later
        turn's prompt must not reuse it, nor a request its output positions computed as another's prompt.
        Nothing for a request asking for prompt logprobs before its first token (vLLM does the same)."""
        end = len(request.token_ids) if limit is None else limit
        if request.sampling.prompt_logprobs is not None and request.num_output_tokens == 0:
            return []  # every prompt position's logits are asked for: none of it may come from the cache
        if self.config.prompt_blocks_only:
            end = min(end, request.num_prompt_tokens)
        return request.token_ids[:end]

    def publish(self, request: Request) -> None:
        """Make the request's newly full computed blocks findable (prompt blocks only, deterministic)."""
        computed = request.num_computed_tokens
        if self.config.prompt_blocks_only:
            computed = min(computed, request.num_prompt_tokens)
        self.kv.cache_computed(request.request_id, request.token_ids, computed)

    def add_to_recompute(self, request: Request) -> None:
        """Queue first a request another decode node handed over as tokens only (no KV): it is admitted as a
        preempted request whose KV is recomputed (``recomputes_total``), then decodes on."""
        assert request.num_output_tokens >= 1 and request.num_computed_tokens == 0
        request.transition(RequestStatus.PREEMPTED)
        self.waiting.appendleft(request)

    def _count_admission(self, request: Request, cached_tokens: int) -> None:
        """Prompt and prefix-hit counters: once per request, at its first admission."""
        self.stats.requests_admitted_total += 1
        self.stats.prompt_tokens_total += request.num_prompt_tokens
        self.stats.prefix_hit_tokens_total += cached_tokens
        self.stats.prefix_hit_requests_total += cached_tokens > 0

    # ---- one step ---------------------------------------------------------------------------------
    def schedule(self) -> StepBatch:
        batch = StepBatch()
        self._releasing_blocks = 0
        self._owed = self._owed_to_prefills()
        admitted, self._admitted_since_step = self._admitted_since_step, False
        budget = self.config.max_num_batched_tokens
        for request in list(self.running):
            if budget == 0 or len(batch.scheduled) == self.config.max_num_seqs:
                break  # requests past max_num_seqs (adopted or committed over it) wait for the next step
            if request not in self.running:  # preempted earlier in this loop
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if self._grow(request, request.num_computed_tokens + num_new, batch):
                batch.scheduled.append(ScheduledRequest(request, num_new, request.num_computed_tokens))
                budget -= num_new
        if not batch.preempted:
            admitted |= self._admit_waiting(batch, budget)
        decoded = any(s.request.status is RequestStatus.RUNNING_DECODE for s in batch.scheduled)
        signal = StepSignal(decoded=decoded, preempted=bool(batch.preempted), admitted=admitted,
                            idle=not self.has_unfinished())
        self.admission.on_step(signal, self.running, self.kv.block_size)
        return batch

    def headroom_blocks(self, extra: Iterable[Request] = ()) -> int:
        """Blocks the admission policy keeps free for the running requests (and ``extra`` ones) beyond what
        they hold — a prefilling request counts as holding its whole prompt, which ``_owed_to_prefills``
        already keeps free. A sum over the requests, so it can be grown one request at a time."""
        return self._headroom_of([*self.running, *extra])

    def _headroom_of(self, requests: list[Request]) -> int:
        def held(request: Request) -> int:
            rid = request.request_id
            blocks = len(self.kv.block_ids(rid)) if self.kv.has_request(rid) else 0
            if request.status is RequestStatus.RUNNING_PREFILL:
                blocks = max(blocks, math.ceil((request.num_tokens + 1) / self.kv.block_size))
            return blocks

        by_id = {r.request_id: r for r in requests}
        return self.admission.headroom_blocks(requests, self.kv.block_size, lambda rid: held(by_id[rid]))

    def _grow(self, request: Request, num_tokens: int, batch: StepBatch) -> bool:
        """Blocks for ``request`` to hold ``num_tokens``, preempting decoding requests (newest first) when
        short. A decode may not take the blocks still owed to running prefills, so an admitted prefill
        always finishes and gets its first decode token."""
        rid, prefilling = request.request_id, request.status is RequestStatus.RUNNING_PREFILL
        kept = 0 if prefilling else self._owed
        while self.kv.allocate(rid, num_tokens, keep_free=kept) is None:
            if self._releasing_blocks >= self.kv.blocks_needed(rid, num_tokens):
                return False  # a swap-out frees enough once this step ended: wait one step
            victim = self._pick_victim(exclude=batch.scheduled)
            if victim is None:
                return False
            self._preempt(victim, batch)
            if victim is request:
                return False
        if prefilling:
            self._owed = self._owed_to_prefills()
        return True

    def _pick_victim(self, exclude: Iterable[ScheduledRequest]) -> Request | None:
        """The most recently admitted decoding request not already scheduled this step."""
        busy = {s.request.request_id for s in exclude}
        decoding = [r for r in self.running
                    if r.status is RequestStatus.RUNNING_DECODE and r.request_id not in busy]
        return max(decoding, key=lambda r: r.admitted_seq, default=None)

    def _preempt(self, request: Request, batch: StepBatch) -> None:
        self.running.remove(request)
        rid, blocks = request.request_id, self.kv.block_ids(request.request_id)
        kv_blocks = blocks[: math.ceil(request.num_computed_tokens / self.kv.block_size)]
        if self.offloader is not None and self.offloader.claim(rid, len(kv_blocks)):
            batch.swap_out.append(SwapOut(rid, tuple(kv_blocks)))  # freed by release_swapped()
            self._releasing_blocks += len(blocks)
            self.stats.offloads_total += 1
        else:
            self.kv.free(rid)
            request.num_computed_tokens = 0
            request.pending_state = None  # a parked state is of its whole prompt: recomputed, it starts elsewhere
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

    def _admit_waiting(self, batch: StepBatch, budget: int) -> bool:
        """Admit in queue order while budget, slots and blocks allow; True if any was. A preempted request
        whose copy is on its way back from the cache-store is passed over, and the requests behind it are
        admitted only from the blocks its resume does not need (``owed``: this step's admissions take none
        of its room), so a slow or hung store holds up only the requests whose KV it has; any other request
        that cannot be admitted stops the scan (nobody overtakes it)."""
        owed = self._owed
        headroom = self.headroom_blocks()
        admitted = False
        for request in list(self.waiting):
            if budget == 0 or len(self.running) >= self.config.max_num_seqs:
                break
            kept = self.offloader.ready(request.request_id) if self.offloader is not None else None
            if kept is False:  # its copy is in the cache-store or on its way back
                prefix = self._room_to_resume(request, owed)
                if prefix is None:
                    break  # no room for it: a copy fetched now would only sit in host memory
                self.offloader.prefetch(request.request_id)
                owed += self.kv.blocks_needed(request.request_id, request.num_tokens + 1, prefix)  # not theirs
                continue
            if kept:
                if not self._resume(request, batch, owed):
                    break
            else:
                prefix = self.usable_prefix(request)
                needed = self.kv.blocks_needed(request.request_id, request.num_tokens + 1, prefix)
                keep = owed if request.status is RequestStatus.PREEMPTED else owed + headroom
                if self.kv.num_free_blocks - keep < needed:
                    break
                num_new = min(request.num_tokens - prefix.num_tokens, budget)
                if self.kv.allocate(request.request_id, prefix.num_tokens + num_new, prefix) is None:
                    break
                self.waiting.remove(request)
                self._admit(request, prefix)
                batch.scheduled.append(ScheduledRequest(request, num_new, request.num_computed_tokens))
                headroom += self._headroom_of([request])
            admitted = True
            owed += self.kv.blocks_needed(request.request_id, request.num_tokens + 1)
            budget -= batch.scheduled[-1].num_new_tokens
        return admitted

    def usable_prefix(self, request: Request) -> PrefixMatch:
        """The prefix cache's hit for ``request``; a hybrid model's only as far as a state checkpoint covers it, with
        where the request is to checkpoint its state noted on it (``Request.state_saves``)."""
        match = self.kv.match_prefix(self.prefix_tokens(request))
        if self.checkpoints is None:
            return match
        usable = self.checkpoints.usable(match)
        request.state_saves = self.checkpoints.positions(request.num_prompt_tokens, match, usable, self.kv.block_size)
        return usable

    def _resume(self, request: Request, batch: StepBatch, owed: int) -> bool:
        """Readmit a preempted request whose KV was kept: blocks the prefix cache still holds are shared,
        the rest are copied back (``swap_in``); it goes on decoding where it stopped."""
        rid, computed = request.request_id, request.num_computed_tokens
        prefix = self._room_to_resume(request, owed)
        if prefix is None or self.kv.allocate(rid, request.num_tokens, prefix) is None:
            return False
        self.waiting.remove(request)
        kv_blocks = self.kv.block_ids(rid)[: math.ceil(computed / self.kv.block_size)]
        batch.swap_in.append(SwapIn(rid, tuple(kv_blocks[prefix.num_blocks:]), prefix.num_blocks))
        request.admitted_seq = next(self._admissions)
        request.transition(RequestStatus.RUNNING_DECODE)
        self.running.append(request)
        self.stats.resumes_total += 1
        batch.scheduled.append(ScheduledRequest(request, request.num_tokens - computed, computed))
        return True

    def _room_to_resume(self, request: Request, owed: int) -> PrefixMatch | None:
        """The prefix cache's share of a preempted request's kept KV if the free blocks (less ``owed``) can
        take the rest and its next token; None if they cannot."""
        prefix = self.kv.match_prefix(self.prefix_tokens(request, request.num_computed_tokens + 1))  # kept blocks
        needed = self.kv.blocks_needed(request.request_id, request.num_tokens + 1, prefix)
        return prefix if self.kv.num_free_blocks - owed >= needed else None

    def release_swapped(self, batch: StepBatch) -> None:
        """After the step ran: free the blocks whose KV the step copied out."""
        for swap in batch.swap_out:
            self.kv.free(swap.request_id)

    def _admit(self, request: Request, prefix: PrefixMatch) -> None:
        if request.status is RequestStatus.PREEMPTED:
            self.stats.recomputes_total += 1
        first_admission = request.status is RequestStatus.WAITING
        request.num_computed_tokens = prefix.num_tokens
        request.admitted_seq = next(self._admissions)
        request.transition(RequestStatus.RUNNING_PREFILL)
        self.running.append(request)
        if first_admission:
            request.num_cached_tokens = prefix.num_tokens
            self._count_admission(request, prefix.num_tokens)

    # ---- after the model ran ----------------------------------------------------------------------
    def update(self, batch: StepBatch, sampled: dict[str, int]) -> list[Request]:
        """Record computed tokens and sampled ids; return requests that received a token this step."""
        advanced = []
        for item in batch.scheduled:
            request = item.request
            request.num_computed_tokens = item.start + item.num_new_tokens
            self.publish(request)
            if not item.samples:
                continue
            request.append_output(sampled[request.request_id])
            self.stats.generated_tokens_total += 1
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
        if request.grammar_complete:  # nothing more may follow: the grammar wins over min_tokens, ignore_eos
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

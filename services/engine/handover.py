"""Decode role, the sending side of a handover: a preempted request whose KV waits in the cache-store is
offered to another decode node instead of waiting here for room.

A request is *due* once it has waited preempted, its copy stored in the cache-store, for ``after_s``
(counted from when :meth:`Handovers.due` first saw it so). :meth:`lend` takes it out of the waiting queue
(so this node cannot resume it meanwhile) and describes it as a :class:`HandedRequest`; :meth:`settle`
ends the loan: granted → the request leaves this node (its offload copy is forgotten, nothing remote is
deleted: the adopter reads those keys); refused → it goes back to the head of the queue, exactly as it
was. A request aborted while lent is gone when the loan is settled (``settle`` returns None).

All methods run under the engine lock. Control plane: no torch, no gRPC.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from services.engine.kv_offload import KVOffload
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler


@dataclass(frozen=True)
class HandedRequest:
    """A preempted request as another decode node needs it to go on decoding (``AdoptRequest``)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]  # the last one is the next input: its KV is not computed yet
    sampling: SamplingParams
    num_computed_tokens: int
    kv_keys: tuple[bytes, ...]  # cache-store keys of the KV blocks, ceil(num_computed_tokens / block_size)
    num_preemptions: int = 0
    cached_tokens: int = 0


@dataclass
class HandoverStats:
    handovers_out_total: int = 0


class Handovers:
    def __init__(self, scheduler: Scheduler, offload: KVOffload, clock: Callable[[], float] = time.monotonic):
        self.scheduler = scheduler
        self.offload = offload
        self.clock = clock
        self.stats = HandoverStats()
        self.lent: dict[str, Request] = {}
        self._since: dict[str, tuple[int, float]] = {}  # request id → (num_preemptions, first seen stored)

    def due(self, after_s: float) -> list[str]:
        """Waiting preempted requests whose cache-store copy has been there ``after_s`` or longer."""
        now, since, due = self.clock(), {}, []
        for request in self.scheduler.waiting:
            rid = request.request_id
            if request.status is not RequestStatus.PREEMPTED or self.offload.remote_keys(rid) is None:
                continue
            seen = self._since.get(rid)
            if seen is None or seen[0] != request.num_preemptions:  # a new preemption restarts the wait
                seen = (request.num_preemptions, now)
            since[rid] = seen
            if now - seen[1] >= after_s:
                due.append(rid)
        self._since = since
        return due

    def lend(self, request_id: str) -> HandedRequest | None:
        """Take a due request out of the queue for an offer; None if it is no longer waiting preempted with
        a stored copy (it resumed, finished, or is already lent)."""
        request = next((r for r in self.scheduler.waiting if r.request_id == request_id), None)
        keys = self.offload.remote_keys(request_id)
        if request is None or request.status is not RequestStatus.PREEMPTED or keys is None:
            return None
        assert request.num_computed_tokens == request.num_tokens - 1, \
            f"{request_id}: a preempted decode keeps all but its last token's KV"
        self.scheduler.waiting.remove(request)
        self.lent[request_id] = request
        return HandedRequest(
            request_id, tuple(request.prompt_token_ids), tuple(request.output_token_ids), request.sampling,
            request.num_computed_tokens, tuple(keys), request.num_preemptions, request.num_cached_tokens)

    def settle(self, request_id: str, granted: bool) -> Request | None:
        """End a loan. Returns the request if it was still here (not aborted meanwhile)."""
        request = self.lent.pop(request_id, None)
        if request is None or request.status.finished:
            return None
        if granted:
            self.offload.discard(request_id)  # forget the copy; the adopter reads its keys
            request.transition(RequestStatus.FINISHED_ABORTED)  # over here; it finishes there
            self._since.pop(request_id, None)
            self.stats.handovers_out_total += 1
        else:
            self.scheduler.waiting.appendleft(request)
            self._since[request_id] = (request.num_preemptions, self.clock())  # wait again before the next offer
        return request

"""Decode role, the sending side of a handover: a preempted request whose KV waits in the cache-store is
offered to another decode node instead of waiting here for room.

A request is *due* once it has waited preempted, its copy stored in the cache-store, for ``after_s``
(counted from when :meth:`Handovers.due` first saw it so). :meth:`lend` takes it out of the waiting queue
(so this node cannot resume it meanwhile) and describes it as a :class:`HandedRequest`; :meth:`settle`
ends the loan: granted → the request leaves this node (its offload copy is forgotten, nothing remote is
deleted: the adopter reads those keys); refused → it goes back to the head of the queue, exactly as it
was. A request aborted while lent is gone when the loan is settled (``settle`` returns None).

Migration (a draining node moves its *running* requests): :meth:`mark` names requests to move;
:meth:`evict_marked`, between two steps (nothing in flight), takes each marked request that is decoding
out of the batch as a preemption would, its KV copied out to the cache-store whatever the node's
``--offload-remote`` setting, and holds it out of the queue (``migrating``); a marked request already
waiting preempted with a stored copy is taken as it is. :meth:`migrations_ready` lends those whose copy
is stored (``settle`` ends the loan as for a handover); :meth:`end_migrations` puts back at the head of
the queue whatever is still held (its copy not stored yet, or never), to resume here. A node with no
cache-store at all migrates by recompute: the request leaves the batch with its blocks freed and no copy,
and is lent at once as tokens only (``num_computed_tokens`` 0, no keys): its adopter recomputes its KV, and
if no peer takes it, it is recomputed here.

All methods run under the engine lock. Control plane: no torch, no gRPC.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from services.engine.kv_offload import KVOffload
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.step_batch import SwapOut


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

    @property
    def recompute(self) -> bool:
        """Handed as tokens only: the adopter computes its KV again (no copy to fetch)."""
        return self.num_computed_tokens == 0 and not self.kv_keys


@dataclass
class HandoverStats:
    handovers_out_total: int = 0


@dataclass(frozen=True)
class MigrationPoll:
    """What :meth:`Handovers.migrations_ready` found: the requests lent now (to be offered), and how many
    are still marked or waiting for their copy to be stored."""

    ready: list[HandedRequest] = field(default_factory=list)
    pending: int = 0


class Handovers:
    def __init__(self, scheduler: Scheduler, offload: KVOffload, clock: Callable[[], float] = time.monotonic):
        self.scheduler = scheduler
        self.offload = offload
        self.clock = clock
        self.stats = HandoverStats()
        self.lent: dict[str, Request] = {}
        self._since: dict[str, tuple[int, float]] = {}  # request id → (num_preemptions, first seen stored)
        self.marked: set[str] = set()  # to migrate once they decode (a draining node's)
        self.migrating: dict[str, Request] = {}  # taken out of the batch, their copy on its way to the store

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
        self.scheduler.waiting.remove(request)
        return self._lend(request, keys)

    def _lend(self, request: Request, keys: list[bytes] | None) -> HandedRequest:
        """Lend with the keys of its stored copy, or (None) as tokens only, to be recomputed."""
        if keys is None:
            request.num_computed_tokens = 0  # nothing of it is kept: its KV is computed again, there or here
        else:
            assert request.num_computed_tokens == request.num_tokens - 1, \
                f"{request.request_id}: a preempted decode keeps all but its last token's KV"
        self.lent[request.request_id] = request
        return HandedRequest(
            request.request_id, tuple(request.prompt_token_ids), tuple(request.output_token_ids), request.sampling,
            request.num_computed_tokens, tuple(keys or ()), request.num_preemptions, request.num_cached_tokens)

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

    # ---- migration: a draining node moves its running requests -------------------------------------
    def mark(self, requests: Iterable[Request]) -> None:
        """Migrate these (unfinished) requests as soon as they can be: see :meth:`evict_marked`."""
        self.marked.update(r.request_id for r in requests if not r.status.finished)

    def evict_marked(self, copy_out: Callable[[SwapOut], None], busy: Collection[str] = ()) -> list[str]:
        """Between steps: take each marked request that decodes (and is not in ``busy``, the running step)
        out of the batch, its KV copied out by ``copy_out`` (the engine's offload, bound for the cache-store)
        and its blocks freed; a marked request waiting preempted with a stored copy leaves the queue. Both
        are held in ``migrating``. A request the cache-store cannot take now (down, staging full) stays
        marked and decoding. Returns the ids taken."""
        taken = []
        waiting = {r.request_id: r for r in self.scheduler.waiting}
        running = {r.request_id: r for r in self.scheduler.running}
        for rid in list(self.marked):
            request = running.get(rid) or waiting.get(rid)
            if request is None:  # finished, aborted or lent meanwhile: nothing to move
                if rid not in self.lent:
                    self.marked.discard(rid)
                continue
            if rid in waiting:
                if request.status is not RequestStatus.PREEMPTED or self.offload.remote_keys(rid) is None:
                    continue  # it resumes first (or its copy is still on its way): taken once it decodes
                self.scheduler.waiting.remove(request)
            elif request.status is not RequestStatus.RUNNING_DECODE or rid in busy \
                    or request.num_computed_tokens != request.num_tokens - 1 or not self._evict(request, copy_out):
                continue
            self.marked.discard(rid)
            self.migrating[rid] = request
            taken.append(rid)
        return taken

    def _evict(self, request: Request, copy_out: Callable[[SwapOut], None]) -> bool:
        """Preempt a decoding request with its KV copied out for the cache-store; False if no copy could
        be claimed there (nothing changed). A node with no cache-store frees the blocks without a copy
        (migration by recompute)."""
        rid, kv = request.request_id, self.scheduler.kv
        kv_blocks = kv.block_ids(rid)[: math.ceil(request.num_computed_tokens / kv.block_size)]
        if not self.by_recompute and not self._claim_remote(rid, len(kv_blocks)):
            return False
        self.scheduler.running.remove(request)
        if not self.by_recompute:
            copy_out(SwapOut(rid, tuple(kv_blocks)))
        kv.free(rid)
        request.transition(RequestStatus.PREEMPTED)
        return True

    @property
    def by_recompute(self) -> bool:
        """A node with no cache-store migrates by recompute (nothing to copy its KV to)."""
        return self.offload.remote is None

    def _claim_remote(self, request_id: str, num_blocks: int) -> bool:
        """Claim an offload copy in the cache-store (a peer reads it there), even where the node keeps
        preempted KV in host memory first (``remote_first`` is forced for this claim only)."""
        offload = self.offload
        if offload.remote is None or not offload.remote.available():
            return False
        staged = offload.staged_bytes()
        remote_first, offload.remote_first = offload.remote_first, True
        try:
            claimed = offload.claim(request_id, num_blocks)
        finally:
            offload.remote_first = remote_first
        if claimed and offload.staged_bytes() == staged:  # the store failed meanwhile: a host copy, no use here
            offload.discard(request_id)
            return False
        return claimed

    def migrations_ready(self) -> MigrationPoll:
        """Lend each migrating request whose copy the cache-store now holds (settle it with :meth:`settle`)."""
        ready = []
        for rid, request in list(self.migrating.items()):
            if request.status.finished:  # aborted while its copy was stored
                del self.migrating[rid]
                continue
            if self.by_recompute:
                del self.migrating[rid]
                ready.append(self._lend(request, None))
                continue
            keys = self.offload.remote_keys(rid)
            if keys is not None:
                del self.migrating[rid]
                ready.append(self._lend(request, keys))
        return MigrationPoll(ready, len(self.marked) + len(self.migrating))

    def end_migrations(self) -> list[str]:
        """Stop migrating: nothing stays marked, and each request still held goes back to the head of the
        queue (it resumes here from its copy, or is recomputed if the copy was lost). Their ids."""
        self.marked.clear()
        back = [r for r in self.migrating.values() if not r.status.finished]
        self.migrating.clear()
        for request in reversed(back):
            self.scheduler.waiting.appendleft(request)
        return [r.request_id for r in back]

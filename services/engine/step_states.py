"""A hybrid model's recurrent states around each engine step: which slot each scheduled request runs on, what a new
slot starts from, which prefix-cache checkpoints the step writes, and the state a handed-off request takes with it.

The pieces it drives: :class:`~services.engine.state_slots.StateSlots` (which request holds which slot),
:class:`~services.engine.state_checkpoints.StateCheckpoints` (which checkpoint holds which prefix) and
:class:`~services.engine.recurrent_states.RecurrentStates` (the tensors). Called by :class:`LLMEngine` between steps,
never while one runs (the states grow only then).
"""

from __future__ import annotations

import structlog

from kernels.gated_delta import Save
from kvcache.manager import KVCacheManager
from services.engine.recurrent_states import RecurrentStates
from services.engine.request import Request, RequestStatus
from services.engine.scheduler import Scheduler
from services.engine.state_checkpoints import StateCheckpoints
from services.engine.state_slots import StateSlots
from services.engine.step_batch import StepBatch

log = structlog.get_logger(__name__)


class StepStates:
    def __init__(self, states: RecurrentStates, slots: StateSlots, checkpoints: StateCheckpoints,
                 kv: KVCacheManager, scheduler: Scheduler):
        self.states, self.slots, self.checkpoints = states, slots, checkpoints
        self.kv, self.scheduler = kv, scheduler

    def plan(self, batch: StepBatch) -> tuple[dict[str, int], tuple[Save, ...]]:
        """The scheduled requests' slots, and the checkpoints the step writes (planned after every restore of this
        step, so that a checkpoint evicted here has been read)."""
        slots = self._plan_slots(batch)
        return slots, self._plan_saves(batch)

    def _plan_slots(self, batch: StepBatch) -> dict[str, int]:
        """Free the slots of requests that stopped running, then the scheduled requests' slots (growing the states
        when more requests run than they hold), with the states parked on requests committed while none was free. A
        request given a new slot starts at its first token, brings its parked state, or starts from the state
        checkpoint of its prefix hit."""
        states = self.states
        self.sweep()
        slots: dict[str, int] = {}
        for item in batch.scheduled:
            request, new = item.request, item.request.request_id not in self.slots
            slot = slots[request.request_id] = self.slots.assign(request.request_id)
            if slot >= states.capacity:  # a few slots at a time, outside the kv_cache_gib budget
                states.grow(max(slot + 1, states.capacity + max(1, states.capacity // 16)))
                log.warning("more requests run than max_num_seqs: recurrent states grown", slots=states.capacity)
            pending, request.pending_state = request.pending_state, None
            if pending is not None and item.start > 0:
                states.write(slot, pending)
            elif new and item.start > 0:
                states.restore(self._checkpoint_at(request, item.start), slot)
        return slots

    def _checkpoint_at(self, request: Request, start: int) -> int:
        """The state checkpoint of ``request``'s first ``start`` tokens, which its prefix hit found (the scheduler
        admitted it in this step, before any checkpoint was saved or evicted)."""
        block_size = self.kv.block_size
        checkpoint = None
        if start % block_size == 0:
            checkpoint = self.checkpoints.lookup(self.kv.block_hashes(request.request_id)[start // block_size - 1])
        if checkpoint is None:
            raise RuntimeError(f"{request.request_id} would resume at token {start} without its recurrent state")
        return checkpoint

    def _plan_saves(self, batch: StepBatch) -> tuple[Save, ...]:
        """Each scheduled request's checkpoint positions (``Request.state_saves``) among its new tokens, but those
        already saved, and those for which every checkpoint is taken by this step's other saves."""
        saves: list[Save] = []
        for seq, item in enumerate(batch.scheduled):
            request, end = item.request, item.start + item.num_new_tokens
            for position in request.state_saves:
                if item.start < position <= end:
                    key = self.kv.prefix_key(request.request_id, request.token_ids, position)
                    checkpoint = self.checkpoints.reserve(key, busy={save.into for save in saves})
                    if checkpoint is not None:
                        saves.append(Save(seq, position - item.start, checkpoint))
        return tuple(saves)

    def sweep(self) -> None:
        """Free the slots of requests no longer running (so that the slots in use never outnumber the running
        requests)."""
        running = {r.request_id for r in self.scheduler.running}
        self.slots.sweep(running.__contains__)

    def handed_off(self, request: Request) -> bytes | None:
        """The state of a prefill-only request handed off in this step (its decode node goes on from it), read before
        its slot is freed; None for any other request."""
        if request.status is not RequestStatus.FINISHED_HANDED_OFF or request.embed:
            return None
        return self.states.read(self.slots.slot_of(request.request_id))

    def check_integrity(self) -> None:
        running = {r.request_id for r in self.scheduler.running}
        stray = sorted(self.slots.holders() - running)
        assert not stray, f"requests that do not run hold state slots: {stray}"
        self.checkpoints.check_integrity()

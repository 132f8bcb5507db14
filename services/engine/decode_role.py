"""The decode role's engine calls: reservations for a prefill node's KV (``reservations.py``), and
preempted requests handed to another decode node (``handover.py``) or adopted from one (``adoption.py``).

A mixin of :class:`~services.engine.engine.LLMEngine`: the methods run under the engine lock (the node
calls them through ``EngineWorker.call``, e.g. ``await worker.call(LLMEngine.receive_blocks, rid, ids)``);
``_check_new_id``, ``encode_prompt`` and ``kv_pool`` are LLMEngine's. Node code uses these methods only,
never the reservation book, the handover queue or the adoptions themselves.

Life of a reservation here: :meth:`reserve` → :meth:`receive_blocks` per block batch (the node writes
their bytes with ``LLMEngine.write_kv_blocks``; :meth:`unreceive_blocks` if that failed) and
:meth:`renew_reservation` per keepalive → :meth:`commit`. :meth:`expire_reservations` frees those whose
lease ran out. The lease calls return the lease's length in seconds (its deadline is now + that).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from services.engine.adoption import AdoptionGrant, Adoptions
from services.engine.detokenizer import IncrementalDetokenizer
from services.engine.errors import InvalidRequestError
from services.engine.handover import HandedRequest, Handovers, MigrationPoll
from services.engine.kv_offload import KVOffload
from services.engine.recurrent_states import RecurrentStates
from services.engine.request import Request, RequestStatus
from services.engine.request_trace import RequestTrace, end_trace
from services.engine.reservations import IncompleteTransferError, Refusal, Reservation, ReservationBook
from services.engine.sampling_params import SamplingParams
from services.engine.state_slots import StateSlots
from services.engine.validation import RequestValidator

__all__ = ["AdoptionGrant", "DecodeRole", "HandedRequest", "MigrationPoll", "Refusal", "Reservation"]
"""The dataclasses the decode role's calls take and return, importable from here by the node."""


class DecodeRole:
    reservations: ReservationBook
    handovers: Handovers
    adoptions: Adoptions
    validator: RequestValidator
    eos_token_ids: tuple[int, ...]
    kv_pool: torch.Tensor
    offload: KVOffload
    _in_flight: set[str]
    _requests: dict[str, Request]
    _detokenizers: dict[str, IncrementalDetokenizer]
    check_structured: Callable[..., None]
    state_slots: StateSlots | None  # a hybrid model's (engine.py)
    recurrent_states: RecurrentStates | None
    _sweep_state_slots: Callable[[], None]

    # ---- reservations: KV a prefill node computes for this node -----------------------------------------
    def reserve(self, request_id: str, prompt_ids: Sequence[int], sampling: SamplingParams,
                lease_s: float) -> Reservation | Refusal:
        """Grant KV blocks for a prompt that a prefill node will compute (see ``reservations.py``)."""
        self._check_new_id(request_id)
        ids = self.encode_prompt(token_ids=prompt_ids)
        bad_words = self.validator.validate(ids, sampling)
        request = Request(request_id, ids, sampling, eos_token_ids=self.eos_token_ids, bad_word_ids=bad_words)
        return self.reservations.reserve(request, lease_s)

    def receive_blocks(self, request_id: str, block_ids: list[int]) -> float:
        """Check that ``block_ids`` are the reservation's granted, uncached blocks not sent before; mark
        them received and renew the lease. The caller then writes their bytes (no lock needed). Raises
        ``LeaseExpiredError`` (no such reservation) or ``InvalidRequestError`` (a block not allowed)."""
        return self.reservations.receive(request_id, block_ids).lease_s

    def unreceive_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Undo :meth:`receive_blocks` for blocks whose bytes never arrived (they may be sent again)."""
        self.reservations.unreceive(request_id, block_ids)

    def receive_state(self, request_id: str, offset: int, total_bytes: int, payload: bytes) -> float:
        """A piece of a hybrid model's recurrent state (``KVState``), at ``offset`` of ``total_bytes``: kept with the
        reservation until :meth:`commit` writes it into the request's state slot; renews the lease. Raises
        ``LeaseExpiredError`` (no such reservation) or ``InvalidRequestError`` naming the field (nothing kept) for a
        model without one, another size, a piece out of order or past the end."""
        reservation = self.reservations.get(request_id)
        size = 0 if self.recurrent_states is None else self.recurrent_states.bytes_per_slot
        if not size:
            raise InvalidRequestError("state", "this node's model keeps no recurrent state")
        if total_bytes != size:
            raise InvalidRequestError("state.total_bytes", f"is {total_bytes}, this node's model's state is {size}")
        if offset != len(reservation.recurrent_state):
            raise InvalidRequestError("state.offset", f"is {offset}, where {len(reservation.recurrent_state)} bytes "
                                                      "of the state arrived so far")
        if offset + len(payload) > size:
            raise InvalidRequestError("state.payload", f"{len(payload)} bytes at {offset} run past the state's {size}")
        reservation.recurrent_state += payload
        return self.reservations.renew(request_id).lease_s

    def renew_reservation(self, request_id: str) -> float:
        """A keepalive from the prefill node: the lease holds on. Raises ``LeaseExpiredError``."""
        return self.reservations.renew(request_id).lease_s

    def expire_reservations(self, busy: frozenset[str] = frozenset()) -> list[str]:
        """Free the reservations whose lease passed without traffic, but for those in ``busy`` (a batch of
        theirs is being written: freeing its blocks now would let the write land in blocks the pool may give
        to another request); their request ids."""
        return self.reservations.expire(busy)

    def commit(self, request_id: str, first_token_id: int, trace: RequestTrace | None = None,
               num_computed_tokens: int = 0) -> Request:
        """All of the prompt's blocks arrived: the request joins the decode batch after its first token.
        ``trace``: the node's span hook for the request (``request_trace.py``), if it traces it.
        ``num_computed_tokens`` (0 = not said): the prompt tokens the sender's blocks hold, which must be
        the whole prompt. Raises ``InvalidRequestError`` (nothing changed) for a first token outside the
        vocabulary (it would fail the next step, and with it the engine thread) or another length."""
        reservation = self.reservations.get(request_id)
        if not 0 <= first_token_id < self.validator.vocab_size:
            raise InvalidRequestError("commit.first_token_id", f"token id {first_token_id} is outside the "
                                                               f"vocabulary [0, {self.validator.vocab_size})")
        prompt_tokens = reservation.request.num_prompt_tokens
        if num_computed_tokens and num_computed_tokens != prompt_tokens:
            raise InvalidRequestError("commit.num_computed_tokens", f"is {num_computed_tokens}, the prompt has "
                                                                    f"{prompt_tokens} tokens")
        spec = reservation.request.sampling.structured
        if spec is not None:  # the prefill node sampled it under the same grammar: anything else is a bug there
            self.check_structured(spec, [first_token_id], "commit.first_token_id")
        state = reservation.recurrent_state
        if self.recurrent_states is not None and len(state) != self.recurrent_states.bytes_per_slot:
            raise IncompleteTransferError(f"{request_id!r}: commit before its recurrent state arrived ({len(state)} "
                                          f"of {self.recurrent_states.bytes_per_slot} bytes)")
        request = self.reservations.commit(request_id, first_token_id)
        if self.state_slots is not None and self.recurrent_states is not None:  # it runs from now: its state too
            self._sweep_state_slots()
            if self.state_slots.free_within(self.recurrent_states.capacity):
                self.recurrent_states.write(self.state_slots.assign(request_id), state)
            else:  # more requests run than max_num_seqs: the step that schedules it gives it a slot
                request.pending_state = bytes(state)
        request.trace = trace if trace is not None else request.trace
        self._requests[request_id] = request
        return request

    # ---- handover: the sending side -----------------------------------------------------------------
    def handovers_due(self, after_s: float) -> list[str]:
        """Preempted requests whose KV has waited in the cache-store ``after_s`` or longer (handover.py)."""
        return self.handovers.due(after_s)

    def lend(self, request_id: str) -> HandedRequest | None:
        """Take a due request out of the queue while it is offered to another node; None if not due."""
        return self.handovers.lend(request_id)

    def settle_handover(self, request_id: str, granted: bool) -> bool:
        """End an offer: granted → the request leaves this node; refused → it waits here as before. False
        if it was aborted meanwhile (then nothing is left of it here)."""
        request = self.handovers.settle(request_id, granted)
        if request is None:
            return False
        if granted:
            end_trace(request)
            self._requests.pop(request_id, None)
            self._detokenizers.pop(request_id, None)
        return True

    # ---- migration: a draining node moves its running requests (handover.py) ------------------------
    def mark_for_migration(self, request_ids: Sequence[str]) -> list[str]:
        """Migrate these requests: the next turn of the engine loop takes each that decodes out of the batch
        with its KV copied to the cache-store (:meth:`evict_for_migration`). Returns the ids marked (those
        this engine runs or queues; a reservation not yet committed is not)."""
        requests = [self._requests[rid] for rid in request_ids if rid in self._requests]
        self.handovers.mark(requests)
        return [r.request_id for r in requests]

    def newest_decoding(self, count: int) -> list[str]:
        """The ``count`` most recently admitted decoding requests, newest first: those preemption would
        take first (what a rebalance moves)."""
        decoding = [r for r in self.scheduler.running if r.status is RequestStatus.RUNNING_DECODE]
        return [r.request_id for r in sorted(decoding, key=lambda r: -r.admitted_seq)[:count]]

    def evict_for_migration(self) -> list[str]:
        """Between steps (the node's loop hook, nothing in flight): take the marked requests out of the
        batch, their KV bound for the cache-store; their ids."""
        if not self.handovers.marked:
            return []
        return self.handovers.evict_marked(lambda swap: self.offload.copy_out(self.kv_pool, [swap]), self._in_flight)

    def migrations_ready(self) -> MigrationPoll:
        """Lend the migrating requests whose copy is stored; offer each, then :meth:`settle_handover` it."""
        return self.handovers.migrations_ready()

    def end_migrations(self) -> list[str]:
        """Stop migrating: what is still marked stays, what waits for its copy resumes here. Their ids."""
        return self.handovers.end_migrations()

    # ---- handover: the receiving side (adoption) ----------------------------------------------------
    def adopt(self, handed: HandedRequest, lease_s: float) -> AdoptionGrant | Refusal:
        """Blocks for a request another decode node hands over, if the admission policy leaves room; its
        KV is then fetched into ``AdoptionGrant.block_ids`` and :meth:`complete_adoption` starts it."""
        self._check_new_id(handed.request_id)
        if self.state_slots is not None and not handed.recompute:  # a hybrid model's state is not in the KV copy
            handed = dataclasses.replace(handed, num_computed_tokens=0, kv_keys=())
        bad = next((t for t in handed.output_token_ids if not 0 <= t < self.validator.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError("output_token_ids", f"token id {bad} is outside the vocabulary "
                                                          f"[0, {self.validator.vocab_size})")
        self.encode_prompt(token_ids=[*handed.prompt_token_ids, *handed.output_token_ids])  # vocabulary
        bad_words = self.validator.validate(handed.prompt_token_ids, handed.sampling)
        if handed.sampling.structured is not None:  # its grammar state is rebuilt here from these tokens
            self.check_structured(handed.sampling.structured, handed.output_token_ids, "output_token_ids")
        return self.adoptions.adopt(handed, self.eos_token_ids, lease_s, bad_words)

    def complete_adoption(self, request_id: str, payload: bytes | memoryview,
                          trace: RequestTrace | None = None) -> Request:
        """Write the fetched KV (``payload``, wire order) into the grant's blocks and start decoding;
        ``trace`` as for :meth:`commit`. Raises ``LeaseExpiredError`` if the grant is gone and
        ``ValueError`` (the grant freed) if ``payload`` does not fill it."""
        request = self.adoptions.complete(request_id, payload, self.kv_pool)
        request.trace = trace if trace is not None else request.trace
        self._requests[request_id] = request
        return request

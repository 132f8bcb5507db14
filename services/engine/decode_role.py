"""The decode role's engine calls: reservations for a prefill node's KV (``reservations.py``), and
preempted requests handed to another decode node (``handover.py``) or adopted from one (``adoption.py``).

A mixin of :class:`~services.engine.engine.LLMEngine`: the methods run under the engine lock (the node
calls them through ``EngineWorker.call``); ``_check_new_id`` and ``encode_prompt`` are LLMEngine's.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.engine.adoption import AdoptionGrant, Adoptions
from services.engine.detokenizer import IncrementalDetokenizer
from services.engine.handover import HandedRequest, Handovers
from services.engine.request import Request
from services.engine.request_trace import end_trace
from services.engine.reservations import Refusal, Reservation, ReservationBook
from services.engine.sampling_params import SamplingParams
from services.engine.validation import RequestValidator


class DecodeRole:
    reservations: ReservationBook
    handovers: Handovers
    adoptions: Adoptions
    validator: RequestValidator
    eos_token_ids: tuple[int, ...]
    _requests: dict[str, Request]
    _detokenizers: dict[str, IncrementalDetokenizer]

    def reserve(self, request_id: str, prompt_ids: Sequence[int], sampling: SamplingParams,
                lease_s: float) -> Reservation | Refusal:
        """Grant KV blocks for a prompt that a prefill node will compute (see ``reservations.py``)."""
        self._check_new_id(request_id)
        ids = self.encode_prompt(token_ids=prompt_ids)
        self.validator.validate(ids, sampling)
        request = Request(request_id, ids, sampling, eos_token_ids=self.eos_token_ids)
        return self.reservations.reserve(request, lease_s)

    def commit(self, request_id: str, first_token_id: int) -> Request:
        """All of the prompt's blocks arrived: the request joins the decode batch after its first token."""
        request = self.reservations.commit(request_id, first_token_id)
        self._requests[request_id] = request
        return request

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

    def adopt(self, handed: HandedRequest, lease_s: float) -> AdoptionGrant | Refusal:
        """Blocks for a request another decode node hands over, if the admission policy leaves room; its
        KV is then fetched into ``AdoptionGrant.block_ids`` and :meth:`complete_adoption` starts it."""
        self._check_new_id(handed.request_id)
        self.encode_prompt(token_ids=[*handed.prompt_token_ids, *handed.output_token_ids])  # vocabulary
        self.validator.validate(handed.prompt_token_ids, handed.sampling)
        return self.adoptions.adopt(handed, self.eos_token_ids, lease_s)

    def complete_adoption(self, request_id: str, payload: bytes | memoryview) -> Request:
        request = self.adoptions.complete(request_id, payload, self.runner.kv_cache)
        self._requests[request_id] = request
        return request

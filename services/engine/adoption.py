"""Decode role, the receiving side of a handover: taking over a request another decode node preempted,
whose KV waits in the cache-store (``handover.py`` is the sender's side).

:meth:`Adoptions.adopt` checks room exactly as a reservation does (the admission policy's headroom for the
running and granted requests stays free) and allocates blocks for the request's computed tokens: the
leading blocks this node's prefix cache already holds are shared, the rest are to be filled from the
cache-store — the :class:`AdoptionGrant` says which keys go into which blocks. Until :meth:`complete` the
blocks are a :class:`~services.engine.reservations.Reservation` in the engine's book, so an abort, the lease
and duplicate ids behave as for a prefill node's reservation, and later grants count this request's
headroom. :meth:`complete` writes the fetched bytes and adds the request to the decode batch with its
prompt and generated tokens: its next step feeds the last generated token, so max_tokens, stop tokens,
usage and the seeded sampler's output position all continue where the other node stopped.

A request handed as tokens only (:attr:`HandedRequest.recompute`: no KV computed, no keys — a node with no
cache-store migrating it) is granted on the same room check but holds no blocks: :meth:`complete` puts it
at the head of the queue as a preempted request whose KV is recomputed, prompt and generated tokens alike,
before it decodes on (counted in ``recomputes_total``).

Runs under the engine lock (``complete`` writes the blocks there, so an abort cannot free them mid-write).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvcache.kv_bytes import write_blocks
from kvcache.manager import KVCacheManager
from services.engine.errors import InvalidRequestError
from services.engine.handover import HandedRequest
from services.engine.request import Request
from services.engine.reservations import Refusal, Reservation, ReservationBook
from services.engine.scheduler import Scheduler


@dataclass(frozen=True)
class AdoptionGrant:
    request_id: str
    keys: tuple[bytes, ...]  # to fetch from the cache-store, in order
    block_ids: tuple[int, ...]  # where their bytes go, one per key


@dataclass
class AdoptionStats:
    handovers_in_total: int = 0
    fetched_bytes_total: int = 0


class Adoptions:
    def __init__(self, kv: KVCacheManager, scheduler: Scheduler, book: ReservationBook):
        self.kv = kv
        self.scheduler = scheduler
        self.book = book
        self.stats = AdoptionStats()

    def adopt(self, handed: HandedRequest, eos_token_ids: tuple[int, ...], lease_s: float,
              bad_word_ids: tuple[tuple[int, ...], ...] = ()) -> AdoptionGrant | Refusal:
        """Blocks for ``handed`` if the admission policy leaves room (nothing is allocated when refused)."""
        self._check(handed)
        full = self.book.no_free_slot()
        if full is not None:
            return full
        rid, computed = handed.request_id, handed.num_computed_tokens
        request = Request(rid, list(handed.prompt_token_ids), handed.sampling, eos_token_ids=eos_token_ids,
                          bad_word_ids=bad_word_ids)
        for token_id in handed.output_token_ids:
            request.append_output(token_id)
        request.num_computed_tokens = computed  # once its blocks are written
        request.num_preemptions = handed.num_preemptions
        request.num_cached_tokens = handed.cached_tokens
        prefix = self.scheduler.usable_prefix(request)  # full blocks of computed tokens (a hybrid's: checkpointed)
        needed = self.kv.blocks_needed(rid, request.num_tokens + 1, prefix)
        refusal = self.book.no_room(rid, needed)  # the oldest refused prefill request's blocks kept too
        if refusal is not None:
            return refusal
        if handed.recompute:
            self.kv.allocate(rid, 0)  # an empty table: its blocks come when it is admitted to recompute
        elif self.kv.allocate(rid, computed, prefix) is None:
            return Refusal(f"no room: {needed} blocks needed")
        block_ids = self.kv.block_ids(rid)
        self.book.reservations[rid] = Reservation(request, block_ids, prefix.num_blocks, lease_s,
                                                  self.book.clock() + lease_s)
        return AdoptionGrant(rid, handed.kv_keys[prefix.num_blocks:], tuple(block_ids[prefix.num_blocks:]))

    def complete(self, request_id: str, payload: bytes | memoryview, kv_cache: torch.Tensor) -> Request:
        """Write the fetched blocks and start decoding. Raises ``LeaseExpiredError`` if the grant is gone
        (aborted, expired) and ``ValueError`` (blocks freed) if ``payload`` has the wrong size."""
        reservation = self.book.get(request_id)
        blocks = reservation.pending_block_ids
        try:
            write_blocks(kv_cache, blocks, payload)
        except ValueError:
            self.book.cancel(request_id)
            raise
        del self.book.reservations[request_id]
        request = reservation.request
        if request.num_computed_tokens == 0:  # handed as tokens only
            self.kv.free(request_id)
            self.scheduler.add_to_recompute(request)
        else:
            self.scheduler.publish(request)
            self.scheduler.add_adopted(request)
        self.stats.handovers_in_total += 1
        self.stats.fetched_bytes_total += len(payload)
        return request

    def _check(self, handed: HandedRequest) -> None:
        prompt, output = handed.prompt_token_ids, handed.output_token_ids
        if not output:
            raise InvalidRequestError("output_token_ids", "a handed-over request has generated at least one token")
        if not handed.recompute and handed.num_computed_tokens != len(prompt) + len(output) - 1:
            raise InvalidRequestError("num_computed_tokens", f"must be len(prompt) + len(output) - 1 = "
                                                             f"{len(prompt) + len(output) - 1} (or 0 with no "
                                                             f"kv_keys: recompute), got {handed.num_computed_tokens}")
        num_blocks = math.ceil(handed.num_computed_tokens / self.kv.block_size)
        if len(handed.kv_keys) != num_blocks:
            raise InvalidRequestError("kv_keys", f"{handed.num_computed_tokens} computed tokens fill {num_blocks} "
                                                 f"blocks, got {len(handed.kv_keys)} keys")
        if len(output) >= handed.sampling.max_tokens:
            raise InvalidRequestError("output_token_ids", f"{len(output)} tokens already reach max_tokens "
                                                          f"{handed.sampling.max_tokens}")

"""The prefill role's engine calls: prompts prefilled here and handed off to a decode node, their KV read
out as it becomes complete and held until the decode node has it, and prompt blocks brought in from a
cache-store (``prefix_claims.py``).

A mixin of :class:`~services.engine.engine.LLMEngine`: the methods run under the engine lock (the node
calls them through ``EngineWorker.call``, e.g. ``await worker.call(LLMEngine.admit_prefill, ...)``;
:meth:`PrefillRole.handoff_progress` is the worker's ``on_step`` hook); ``add_request``, ``discard``,
``kv_pool``, ``read_kv_blocks``, ``step`` and ``has_unfinished`` are LLMEngine's. Node code uses these methods
only, never the KV manager, the runner or the held requests themselves.

Life of a request here: :meth:`check_prefill` → (:meth:`claim_prefix_blocks` → the node writes the
fetched KV with ``LLMEngine.write_kv_blocks`` → :meth:`publish_prefix_claim`) → :meth:`admit_prefill` →
:meth:`handoff_progress` after every step (its :class:`FirstToken` and :class:`ReadyBlocks`) → it ends as
``FINISHED_HANDED_OFF`` after its first token, its blocks held → :meth:`end_prefill` (or
:meth:`abort_prefill`) frees everything it holds; its blocks stay in the prefix cache.

An embedding request (:meth:`admit_embedding`, the node's ``Embed``) lives the same way, except that nothing of its
KV is read out: its :class:`FirstToken` carries the final hidden state of its last prompt token (last-token pooling:
after the model's final norm, not L2-normalised), and :meth:`end_prefill` follows at once. :meth:`embed` runs that
in-process.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from kvcache.manager import KVCacheManager
from services.engine import prefix_claims
from services.engine.outputs import RequestOutput
from services.engine.prefill_handoff import FirstToken, Handoff, HandoffPlan, ReadyBlocks
from services.engine.prefix_claims import PrefixClaim
from services.engine.request import Request, RequestStatus
from services.engine.request_trace import RequestTrace
from services.engine.sampling_params import EMBEDDING_SAMPLING, SamplingParams
from services.engine.state_slots import StateSlots
from services.engine.validation import RequestValidator

__all__ = ["FirstToken", "HandoffPlan", "PrefillRole", "PrefixClaim", "ReadyBlocks"]
"""The dataclasses the prefill role's calls take and return, importable from here by the node."""

_EMBEDDING_IDS = itertools.count()


class PrefillRole:
    kv: KVCacheManager
    held: dict[str, Request]  # handed off, KV blocks kept until released
    _handoffs: dict[str, Handoff]  # admitted prefill-only requests (until abort_prefill), in admission order
    validator: RequestValidator
    kv_pool: torch.Tensor
    state_slots: StateSlots | None  # a hybrid model's (engine.py)

    # ---- one prefill-only request -------------------------------------------------------------------
    def check_prefill(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[bytes]:
        """Validate a prompt to be prefilled and handed off (raises ``InvalidRequestError``); the chained
        hashes of its full blocks (what decode nodes and the cache-store match on)."""
        self.validator.validate(self.validator.encode_prompt(token_ids=prompt_ids), sampling, prefill_only=True)
        return self.kv.hash_blocks(prompt_ids)

    def admit_prefill(self, request_id: str, prompt_ids: Sequence[int], sampling: SamplingParams,
                      plan: HandoffPlan, trace: RequestTrace | None = None) -> None:
        """Queue a prefill-only request: it finishes as ``FINISHED_HANDED_OFF`` at its first token, its
        blocks kept; :meth:`handoff_progress` reports it per ``plan``. ``trace``: the node's span hook."""
        request = self.add_request(sampling=sampling, token_ids=prompt_ids, request_id=request_id,
                                   prefill_only=True)
        request.trace = trace
        self._handoffs[request_id] = Handoff(request, plan)

    def admit_embedding(self, request_id: str, prompt_ids: Sequence[int], trace: RequestTrace | None = None) -> None:
        """Queue an embedding request: prefilled as a prefill-only one (prefix cache, chunks, batching alike); its
        :class:`FirstToken` carries the final hidden state of its last prompt token; nothing is read out."""
        request = self.add_request(sampling=EMBEDDING_SAMPLING, token_ids=prompt_ids, request_id=request_id,
                                   prefill_only=True)
        request.embed, request.trace = True, trace
        self._handoffs[request_id] = Handoff(request, HandoffPlan(embed=True))

    def embed(self, prompts: Sequence[Sequence[int]]) -> list[list[float]]:
        """In-process: each prompt's embedding as :meth:`admit_embedding` gives it (the engine steps until all are
        done; everything they held is freed, their blocks stay in the prefix cache)."""
        request_ids = [f"embed-{next(_EMBEDDING_IDS)}" for _ in prompts]
        found: dict[str, list[float]] = {}
        try:
            for request_id, prompt in zip(request_ids, prompts, strict=True):
                self.admit_embedding(request_id, prompt)
            while len(found) < len(request_ids):
                outputs = self.step()
                if not outputs and not self.has_unfinished():
                    missing = [r for r in request_ids if r not in found]
                    raise RuntimeError(f"embedding requests {missing} ended without their embedding")
                for item in self.handoff_progress(outputs):
                    if isinstance(item, FirstToken) and item.embedding is not None:
                        found[item.request_id] = item.embedding
        finally:
            for request_id in request_ids:
                self.end_prefill(request_id)
        return [found[request_id] for request_id in request_ids]

    def handoff_progress(self, outputs: Sequence[RequestOutput]) -> list[FirstToken | ReadyBlocks]:
        """After a step (the prefill node's ``on_step`` hook): the first tokens of admitted requests, then
        the KV of their blocks that became complete, first tokens ahead of that step's blocks. Blocks sent
        by reference are handed over only once the device has finished writing them."""
        items: list[FirstToken | ReadyBlocks] = []
        for out in outputs:  # first tokens go first: the client sees them before the last blocks are sent
            handoff = self._handoffs.get(out.request_id)
            if handoff is not None and out.new_token_ids:
                request = handoff.request
                reason = None if request.status is RequestStatus.FINISHED_HANDED_OFF else out.finish_reason
                items.append(FirstToken(out.request_id, out.new_token_ids[0], reason, request.num_cached_tokens,
                                        out.new_logprobs[0] if out.new_logprobs else None,
                                        tuple(out.prompt_logprobs), out.embedding, out.recurrent_state))
        ready = [(handoff, *new) for handoff in self._handoffs.values()
                 if (new := self._newly_ready(handoff)) is not None]
        pool = self.kv_pool
        if pool.device.type == "cuda" and any(h.plan.by_reference for h, _, _ in ready):
            torch.cuda.synchronize(pool.device)  # the step's kernels wrote these blocks
        for handoff, start, ids in ready:
            rid = handoff.request.request_id
            if handoff.plan.by_reference:
                items.append(ReadyBlocks(rid, start, len(ids), b"", list(ids)))
            else:
                items.append(ReadyBlocks(rid, start, len(ids), self.read_kv_blocks(ids)))
            handoff.blocks_read = start + len(ids)
        return items

    def _newly_ready(self, handoff: Handoff) -> tuple[int, list[int]] | None:
        """``(first index, block ids)`` of the request's complete blocks not read out yet (past the
        skipped ones), or None."""
        request = handoff.request
        if request.status is RequestStatus.FINISHED_ABORTED or handoff.plan.embed:
            return None
        if request.status.finished and request.status is not RequestStatus.FINISHED_HANDED_OFF:
            return None  # ended at its first token: its blocks are already freed, nothing to send
        if not self.kv.has_request(request.request_id):
            return None  # still queued: no blocks yet
        ready = self.transferable_block_ids(request)
        start = max(handoff.blocks_read, handoff.plan.skip_blocks)
        if len(ready) <= start:
            return None
        return start, ready[start:]

    def end_prefill(self, request_id: str, read_computed: bool = False) -> tuple[int, bytes] | None:
        """Free whatever the request still holds here (its blocks stay in the prefix cache). With
        ``read_computed``, first read out the prompt blocks it computed (:meth:`computed_prompt_blocks`)."""
        computed = self.computed_prompt_blocks(request_id) if read_computed else None
        self.abort_prefill(request_id)
        return computed

    def abort_prefill(self, request_id: str) -> bool:
        """End the request wherever it is, with its cache-store claim; False if the engine held nothing
        of it (idempotent)."""
        self._handoffs.pop(request_id, None)
        prefix_claims.release(self.kv, request_id)
        return self.discard(request_id)

    def computed_prompt_blocks(self, request_id: str) -> tuple[int, bytes] | None:
        """``(first block, KV bytes)`` of the full prompt blocks this handed-off request computed here
        (not those it found cached), or None. Call before its blocks are released."""
        request = self.held.get(request_id)
        if request is None or not self.kv.has_request(request_id) or not self.kv.enable_prefix_caching \
                or self.state_slots is not None:
            return None  # (a hybrid model's blocks are no prefix to another node: its state is not in them)
        first = request.num_cached_tokens // self.kv.block_size
        end = request.num_prompt_tokens // self.kv.block_size
        if end <= first:
            return None
        return first, self.read_kv_blocks(self.kv.block_ids(request_id)[first:end])

    def not_started(self, request_ids: Sequence[str]) -> list[str]:
        """Of these request ids, those held here but not started: queued, with no KV blocks yet (a draining
        prefill node ends them for the gateway to run elsewhere)."""
        return [rid for rid in request_ids if self.holds(rid) and not self.kv.has_request(rid)]

    def release(self, request_id: str) -> bool:
        """Free the blocks of a handed-off request (its KV reached the decode node, or never will)."""
        if self.held.pop(request_id, None) is None:
            return False
        self.kv.free(request_id)
        return True

    def transferable_block_ids(self, request: Request) -> list[int]:
        """Blocks whose KV is complete: full computed blocks, or every prompt block once handed off."""
        block_size, blocks = self.kv.block_size, self.kv.block_ids(request.request_id)
        if request.status is RequestStatus.FINISHED_HANDED_OFF:
            return blocks[: -(-request.num_prompt_tokens // block_size)]
        return blocks[: min(request.num_computed_tokens, request.num_prompt_tokens) // block_size]

    # ---- prompt blocks from a cache-store (prefix_claims.py) ----------------------------------------
    def cached_prefix_blocks(self, prompt_ids: Sequence[int]) -> int:
        """How many leading full blocks of the prompt this engine's prefix cache holds now."""
        return self.kv.match_prefix(prompt_ids).num_blocks

    def claim_prefix_blocks(self, request_id: str, prompt_ids: Sequence[int], first_block: int,
                            end_block: int) -> PrefixClaim | None:
        """Allocate blocks for prompt blocks ``first_block .. end_block`` (fetched from elsewhere) that are
        still needed, held by the request's claim. None when they no longer chain onto the local prefix
        (it shrank since the lookup), when the local cache now has them all, or when the pool has no room
        (the prompt is then computed), and with prefix caching off or for a hybrid model (its state is not in the
        blocks). The caller writes the claim's blocks (``write_kv_blocks``)."""
        if not self.kv.enable_prefix_caching or self.state_slots is not None:
            return None
        return prefix_claims.claim(self.kv, request_id, prompt_ids, first_block, end_block)

    def publish_prefix_claim(self, claim: PrefixClaim, prompt_ids: Sequence[int]) -> None:
        """The claimed blocks hold their KV now: index them as prefix hits (they stay held until
        :meth:`release_prefix_claim`, or the request's :meth:`end_prefill`)."""
        self.kv.cache_computed(claim.owner, prompt_ids, claim.end_block * self.kv.block_size)

    def release_prefix_claim(self, request_id: str) -> None:
        """Free the request's claim (published blocks stay cached; unwritten ones go back free)."""
        prefix_claims.release(self.kv, request_id)

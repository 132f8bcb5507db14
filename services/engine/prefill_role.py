"""The prefill role's engine calls: a handed-off request's KV blocks are held until the decode node has
them (``LLMEngine.add_request(..., prefill_only=True)`` ends a request as ``FINISHED_HANDED_OFF``).

A mixin of :class:`~services.engine.engine.LLMEngine`: the methods run under the engine lock (the node
calls them through ``EngineWorker.call``) and use the engine's KV manager and request maps.
"""

from __future__ import annotations

from kvcache.manager import KVCacheManager
from services.engine.request import Request, RequestStatus


class PrefillRole:
    kv: KVCacheManager
    held: dict[str, Request]  # handed off, KV blocks kept until released

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

"""What the prefill role's engine calls hand to a prefill node after each step, and what it tracks per
request until the KV is handed off (``prefill_role.py``).

A prefill-only request is admitted with :class:`HandoffPlan` (blocks the decode node already holds, bytes
or references); after every step :meth:`~services.engine.prefill_role.PrefillRole.handoff_progress` gives
its :class:`FirstToken` and the :class:`ReadyBlocks` whose KV became complete, in prompt order.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.logprobs import TokenLogprobs
from services.engine.request import Request


@dataclass(frozen=True)
class HandoffPlan:
    """How a prefill-only request's KV leaves this engine."""

    skip_blocks: int = 0  # leading blocks the decode node already holds: never read out
    by_reference: bool = False  # its decode node copies blocks out of this pool (CUDA IPC): give ids
    embed: bool = False  # an embedding request: its KV never leaves (nothing is read out); see FirstToken


@dataclass
class ReadyBlocks:
    """KV of blocks ``first_index ..`` of the request's table (prompt order), ``count`` blocks: their
    bytes, or (a request sent by reference) their ids in this engine's pool, computed and synchronised."""

    request_id: str
    first_index: int
    count: int
    payload: bytes
    source_ids: list[int] | None = None


@dataclass
class FirstToken:
    request_id: str
    token_id: int
    finish_reason: str | None  # set when the first token already ends the request
    cached_tokens: int
    logprob: TokenLogprobs | None = None  # when the request asks for logprobs
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # when it asks for prompt logprobs: prompt tokens 1..
    # an embedding request's result (HandoffPlan.embed): the final hidden state of its last prompt token, float32
    # (the token itself means nothing to it)
    embedding: list[float] | None = None
    # a hybrid model's recurrent state after the prompt (``RecurrentStates.read``): its decode node goes on from it
    recurrent_state: bytes | None = None


@dataclass
class Handoff:
    """Engine-side state of an admitted prefill-only request: its plan and the blocks already read out."""

    request: Request
    plan: HandoffPlan
    blocks_read: int = 0

"""The gateway's typed view of its calls to the nodes: what it asks a prefill node (:class:`PrefillCall`)
and what the two legs' streams say (a prefill node's :data:`PrefillEvent` items, a decode node's
:class:`TokenEvent` items). ``node_client`` translates them to and from the ``pdserve.v1`` protos; the
gateway's logic sees only these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.engine.logprobs import TokenLogprobs
from services.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class PrefillCall:
    """``PrefillNode.Prefill``: run ``prompt_ids`` and reserve on the first of ``decode_candidates`` with
    room. ``sampling`` is resolved (max_tokens and seed set; stop strings stay at the gateway)."""

    request_id: str
    prompt_ids: Sequence[int]
    sampling: SamplingParams
    decode_candidates: tuple[str, ...]
    deadline_unix_ms: int = 0  # 0 = none


@dataclass(frozen=True)
class Refused:
    """A decode candidate had no room for the request."""

    decode_address: str
    reason: str


@dataclass(frozen=True)
class Reserved:
    """The decode node that holds the request's reservation: attach there."""

    decode_address: str


@dataclass(frozen=True)
class FirstToken:
    token_id: int
    finish_reason: str  # set when the first token already ends the request (the prefill node ends it)
    cached_tokens: int  # prompt tokens served from a prefix cache
    logprob: TokenLogprobs | None = None  # when the request asks for logprobs
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # when it asks for prompt logprobs: prompt tokens 1..


@dataclass(frozen=True)
class PrefillDone:
    """The prefill node is done with the request (its KV reached the decode node)."""


PrefillEvent = Refused | Reserved | FirstToken | PrefillDone | None
"""One event of a prefill leg; ``None`` for an event of a kind this gateway does not know."""


@dataclass(frozen=True)
class TokenEvent:
    """One event of a decode leg: new tokens (never the first), the last with ``finish_reason``; or
    ``moved_to`` (the request now runs on that decode node, attach there), the last of its stream."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str = ""  # "stop", "length" or "abort"; empty until the last event
    moved_to: str = ""
    abort_reason: str = ""  # with finish_reason "abort": why the node gave up on the request
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token, when the request asks for logprobs

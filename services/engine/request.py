"""A request's state machine and the bookkeeping the scheduler keeps on it."""

from __future__ import annotations

import enum
import time
from array import array
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from services.engine.logprobs import TokenLogprobs
from services.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING_PREFILL = "running_prefill"
    RUNNING_DECODE = "running_decode"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_HANDED_OFF = "finished_handed_off"  # prefill role: first token sampled, KV goes to a decode node

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def running(self) -> bool:
        return self in (RequestStatus.RUNNING_PREFILL, RequestStatus.RUNNING_DECODE)

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISHED = frozenset(
    {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED,
     RequestStatus.FINISHED_HANDED_OFF}
)
_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}
_ALLOWED = {
    # WAITING -> RUNNING_DECODE: a decode node admits a request whose prompt KV a prefill node computed
    # WAITING -> PREEMPTED: a request handed over as tokens only, queued to be recomputed
    RequestStatus.WAITING: {RequestStatus.RUNNING_PREFILL, RequestStatus.RUNNING_DECODE,
                            RequestStatus.PREEMPTED, RequestStatus.FINISHED_ABORTED},
    RequestStatus.RUNNING_PREFILL: {RequestStatus.RUNNING_DECODE, RequestStatus.PREEMPTED, *_FINISHED},
    RequestStatus.RUNNING_DECODE: {RequestStatus.PREEMPTED, *_FINISHED},
    RequestStatus.FINISHED_HANDED_OFF: {RequestStatus.FINISHED_ABORTED},
    # the token that reached max_tokens also completed a stop string (seen only once it is detokenized)
    RequestStatus.FINISHED_LENGTH: {RequestStatus.FINISHED_STOPPED},
    RequestStatus.PREEMPTED: {RequestStatus.RUNNING_PREFILL, RequestStatus.RUNNING_DECODE,
                              RequestStatus.FINISHED_ABORTED},
}


class IllegalTransitionError(AssertionError):
    """A state change the state machine does not allow: a bug in the caller."""


@dataclass
class Request:
    """Everything the engine tracks for one generation.

    ``token_ids`` is the prompt followed by the output so far. ``num_computed_tokens`` counts the leading
    tokens whose KV is in the cache; the scheduler computes ``token_ids[num_computed_tokens:]`` next.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit on first admission, counted once
    num_preemptions: int = 0
    admitted_seq: int = -1  # order of the latest admission; the newest decoding request is the victim
    stop_reason: int | str | None = None
    # sampling.prompt_logprobs: those of prompt tokens 1.. so far, in order (each prefill chunk adds its own)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    first_token_time: float | None = None
    prefill_only: bool = False  # prefill role: stop after the first token and keep the KV for transfer
    embed: bool = False  # prefill role, an embedding request: the step that samples keeps its last row's state
    trace: Any = None  # a request_trace.RequestTrace hook when the node traces this request (tracing on)
    # a constrained request's grammar state, opaque here (the engine's structured/matcher.py RequestGrammar):
    # filled by the engine, rebuilt from the spec and the output tokens when missing or stale
    structured: Any = None
    allowed_mask: Any = None  # sampling.allowed_token_ids as a vocabulary mask (step_sampling's), built once
    bad_word_ids: tuple[tuple[int, ...], ...] = ()  # sampling.bad_words as token sequences (bad_words.py)
    grammar_complete: bool = False  # its grammar ended at the last token: it finishes ("stop")
    # a hybrid model's recurrent state received with the commit while no state slot was free (state_slots.py):
    # written into the slot the step that schedules it gives it
    pending_state: bytes | None = None
    # a hybrid model's prefix cache: the token positions after which its state is checkpointed (state_checkpoints.py),
    # set at each admission
    state_saves: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @cached_property
    def distinct_prompt_ids(self) -> array:
        """The prompt's token ids, each once, as 64-bit ints (what the repetition penalty reads every step)."""
        return array("q", dict.fromkeys(self.prompt_token_ids))

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    def transition(self, new: RequestStatus) -> None:
        if new not in _ALLOWED.get(self.status, ()):
            raise IllegalTransitionError(f"request {self.request_id}: {self.status.name} -> {new.name}")
        self.status = new

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)

"""What the engine reports after each step, per request."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.engine.logprobs import TokenLogprobs


@dataclass
class RequestOutput:
    """The delta a request produced in one step (tokens and stable text), plus totals once finished."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per new token, when asked for
    # with the first token, when sampling.prompt_logprobs asks: one per prompt token after the first
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    embedding: list[float] | None = None  # with the first token of an embedding request (Request.embed)
    # a hybrid model's prefill-only request, handed off at this token: its recurrent state (RecurrentStates.read)
    recurrent_state: bytes | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length", "abort"
    abort_reason: str = ""  # with "abort" by the engine itself: why (e.g. the grammar could not go on)
    stop_reason: int | str | None = None  # the eos/stop token id or stop string that ended it
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class CompletedRequest:
    """A finished request's whole output, as :meth:`LLMEngine.generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    cached_tokens: int
    stop_reason: int | str | None = None  # the eos/stop token id or stop string that ended it
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked for
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per prompt token after the first

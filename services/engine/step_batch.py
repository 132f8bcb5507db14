"""What the scheduler decides each step (``StepBatch``: the chunks to run, the KV to copy out and back), its
settings and counters, and the torch-free view of where preempted KV is kept (``KVOffloader``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from services.engine.request import Request


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 1024
    max_model_len: int = 8192
    prompt_blocks_only: bool = False  # deterministic: the prefix cache publishes and serves prompt blocks only


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    start: int  # num_computed_tokens when scheduled

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the request's tokens, so its last position samples."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass(frozen=True)
class SwapOut:
    """Copy the KV of ``block_ids`` (the victim's table, in order) out before its blocks are freed."""

    request_id: str
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class SwapIn:
    """Copy the request's kept KV, from table index ``first_index`` on, into ``block_ids``."""

    request_id: str
    block_ids: tuple[int, ...]
    first_index: int


class KVOffloader(Protocol):
    """Where preempted KV is kept (host memory, then the cache-store). Torch-free view for the scheduler."""

    def claim(self, request_id: str, num_blocks: int) -> bool:
        """Take room for ``num_blocks`` blocks of ``request_id``; False (nothing taken) if none."""
        ...

    def ready(self, request_id: str) -> bool | None:
        """None: no copy (recompute). False: a copy exists but cannot be loaded this step. True: load it."""
        ...

    def prefetch(self, request_id: str) -> None:
        """Start bringing a remote copy close, so that :meth:`ready` turns True."""
        ...

    def discard(self, request_id: str) -> None: ...


@dataclass
class SchedulerStats:
    prompt_tokens_total: int = 0
    prefix_hit_tokens_total: int = 0
    prefix_hit_requests_total: int = 0
    requests_admitted_total: int = 0
    preemptions_total: int = 0
    offloads_total: int = 0  # preemptions whose KV was kept
    resumes_total: int = 0  # preempted requests resumed from their kept KV
    recomputes_total: int = 0  # preempted requests readmitted by recomputing their KV
    generated_tokens_total: int = 0  # output tokens sampled here


@dataclass
class StepBatch:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swap_out: list[SwapOut] = field(default_factory=list)
    swap_in: list[SwapIn] = field(default_factory=list)

    @property
    def request_ids(self) -> set[str]:
        """Every request whose blocks or kept KV this step touches."""
        return ({s.request.request_id for s in self.scheduled} | {s.request_id for s in self.swap_out}
                | {s.request_id for s in self.swap_in})

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled or self.swap_out)

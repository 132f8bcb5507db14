"""Admission policies: how many KV blocks to keep free for the requests already decoding.

A request admitted now (a new prefill in mixed mode, a reservation on a decode node) may only take blocks
that the running decode requests are not expected to need. Under-estimating that need costs preemptions;
over-estimating it costs throughput (requests wait while memory sits free). The policies:

- ``new_token_ratio`` (default; SGLang's estimator, DESIGN.md section 3): a running request is expected
  to need ``min(max_tokens - generated, clip) × ratio`` more tokens. The ratio starts at ``init``, decays
  by ``(init - min) / decay_steps`` on every decode step with neither a preemption nor an admission, down
  to ``min = init × min_factor``; after a preemption it is re-estimated from what the running requests
  actually generated, ``(Σ generated + k × n_decoding) / (Σ max_tokens + 1)`` with ``k = 16 × block_size``,
  capped at ``init``; it resets to ``init`` when the node is idle.
- ``fixed``: ``blocks`` per running request (never more than it can still use), decaying linearly to
  ``min_blocks`` over ``decay_steps`` quiet decode steps, back to ``blocks`` after a preemption.
- ``none``: keep nothing back (admit whenever the prompt fits; preemption sorts it out).

Control plane: no torch, no gRPC. The scheduler calls :meth:`on_step` once per step and
:meth:`headroom_blocks` whenever it admits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from services.engine.request import Request, RequestStatus

POLICIES = ("new_token_ratio", "fixed", "none")


@dataclass(frozen=True)
class AdmissionConfig:
    policy: str = "new_token_ratio"
    init_ratio: float = 0.7
    min_ratio_factor: float = 0.14
    ratio_decay_steps: int = 600
    clip_tokens: int = 4096
    fixed_blocks: int = 8
    fixed_min_blocks: int = 1
    fixed_decay_steps: int = 600

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"admission policy must be one of {POLICIES}, got {self.policy!r}")
        if not 0 < self.init_ratio <= 1 or not 0 <= self.min_ratio_factor <= 1:
            raise ValueError("init_ratio must be in (0, 1] and min_ratio_factor in [0, 1]")
        if self.ratio_decay_steps < 1 or self.fixed_decay_steps < 1:
            raise ValueError("decay steps must be >= 1")
        if not 0 <= self.fixed_min_blocks <= self.fixed_blocks:
            raise ValueError("need 0 <= fixed_min_blocks <= fixed_blocks")


@dataclass(frozen=True)
class StepSignal:
    """What one scheduling step did, as the policies see it."""

    decoded: bool  # at least one decode token was scheduled
    preempted: bool
    admitted: bool
    idle: bool  # nothing running or waiting


class AdmissionPolicy(Protocol):
    name: str

    def headroom_blocks(self, running: Iterable[Request], block_size: int,
                        allocated: Callable[[str], int]) -> int:
        """Blocks to keep free for ``running`` beyond what they hold (``allocated(request_id)``): a sum of
        one term per request."""
        ...

    def on_step(self, signal: StepSignal, running: Iterable[Request], block_size: int) -> None: ...


def remaining_tokens(request: Request) -> int:
    """Decode tokens ``request`` may still produce here (0 for a prefill-only request)."""
    if request.prefill_only:
        return 0
    return max(0, request.sampling.max_tokens - request.num_output_tokens)


def _decoding(running: Iterable[Request]) -> list[Request]:
    return [r for r in running if r.status is RequestStatus.RUNNING_DECODE]


class NoReservation:
    name = "none"

    def headroom_blocks(self, running, block_size, allocated) -> int:
        return 0

    def on_step(self, signal, running, block_size) -> None:
        pass


class NewTokenRatio:
    name = "new_token_ratio"

    def __init__(self, config: AdmissionConfig):
        self.config = config
        self.init = config.init_ratio
        self.min = config.init_ratio * config.min_ratio_factor
        self.decay = (self.init - self.min) / config.ratio_decay_steps
        self.ratio = self.init

    def headroom_blocks(self, running, block_size, allocated) -> int:
        total = 0
        for request in running:
            expected = request.num_tokens + min(remaining_tokens(request), self.config.clip_tokens) * self.ratio
            total += max(0, math.ceil(expected / block_size) - allocated(request.request_id))
        return total

    def on_step(self, signal, running, block_size) -> None:
        if signal.idle:
            self.ratio = self.init
        elif signal.preempted:
            decoding = _decoding(running)
            generated = sum(r.num_output_tokens for r in decoding)
            max_tokens = sum(r.sampling.max_tokens for r in decoding)
            estimate = (generated + 16 * block_size * len(decoding)) / (max_tokens + 1)
            self.ratio = min(self.init, estimate)
        elif signal.decoded and not signal.admitted:
            self.ratio = max(self.min, self.ratio - self.decay)


class FixedBlocks:
    name = "fixed"

    def __init__(self, config: AdmissionConfig):
        self.config = config
        self.decay = (config.fixed_blocks - config.fixed_min_blocks) / config.fixed_decay_steps
        self.blocks = float(config.fixed_blocks)

    def headroom_blocks(self, running, block_size, allocated) -> int:
        per_request = math.ceil(self.blocks)
        total = 0
        for request in running:
            capacity = allocated(request.request_id) * block_size
            could_use = max(0, math.ceil((request.num_tokens + remaining_tokens(request) - capacity) / block_size))
            total += min(per_request, could_use)
        return total

    def on_step(self, signal, running, block_size) -> None:
        if signal.idle or signal.preempted:
            self.blocks = float(self.config.fixed_blocks)
        elif signal.decoded and not signal.admitted:
            self.blocks = max(float(self.config.fixed_min_blocks), self.blocks - self.decay)


def make_policy(config: AdmissionConfig | None = None) -> AdmissionPolicy:
    config = config or AdmissionConfig()
    if config.policy == "new_token_ratio":
        return NewTokenRatio(config)
    if config.policy == "fixed":
        return FixedBlocks(config)
    return NoReservation()

"""Per-request sampling settings and their validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from services.engine.errors import InvalidRequestError

DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each new token and when to stop (the fields of ``pdserve.v1.SamplingParams``).

    ``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` disable those filters. ``seed`` makes
    random sampling reproducible per request, independent of what else is in the batch.
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    extra: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        """Raise :class:`InvalidRequestError` naming the first bad field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequestError("top_k", f"must be >= 0 (0 disables it), got {self.top_k}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise InvalidRequestError("min_tokens", f"must be in [0, max_tokens], got {self.min_tokens}")
        for token_id in self.stop_token_ids:
            if not 0 <= token_id < vocab_size:
                raise InvalidRequestError("stop_token_ids", f"{token_id} is outside the vocabulary [0, {vocab_size})")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop", "stop strings must not be empty")

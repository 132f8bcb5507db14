"""How many KV blocks a decode node keeps free for its running requests when it grants reservations.

A running request is expected to need ``min(max_tokens - generated, clip) × ratio`` more tokens; the
blocks it still lacks for that are its headroom. This is the fixed-ratio form of the ``new_token_ratio``
policy of DESIGN.md section 3 (the decaying ratio and the ``fixed`` policy are the scheduling issue's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from services.engine.request import Request


@dataclass(frozen=True)
class RatioHeadroom:
    ratio: float = 0.7
    clip_tokens: int = 4096

    def blocks(self, running: Iterable[Request], block_size: int, allocated: dict[str, int]) -> int:
        """Blocks the running requests still need beyond what they hold (``allocated``: id → blocks)."""
        total = 0
        for request in running:
            remaining = min(request.sampling.max_tokens - request.num_output_tokens, self.clip_tokens)
            expected_tokens = request.num_tokens + max(0, remaining) * self.ratio
            total += max(0, math.ceil(expected_tokens / block_size) - allocated.get(request.request_id, 0))
        return total

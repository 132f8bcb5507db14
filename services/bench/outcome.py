"""What one request of a benchmark produced, as measured at the client, and how a stream is timed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestOutcome:
    """Times are seconds. ``itl_s`` has one gap per token after the first (see ``StreamTimer``);
    ``prompt_len`` and ``output_tokens`` are the server's usage numbers when it reports them."""

    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    start_s: float = 0.0  # time.perf_counter() when the request was sent
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (latency − TTFT) / (output tokens − 1)."""
        if self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


class StreamTimer:
    """Times a token stream from its messages' arrival.

    The first message carrying tokens sets TTFT; a later message's gap since the previous one is spread
    evenly over the tokens it carries; tokens that arrive with the first one add gaps of 0. So
    ``len(itl_s) == tokens − 1`` and TTFT + Σ ITL = the last token's arrival.
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.tokens = 0
        self.ttft_s = 0.0
        self.itl_s: list[float] = []
        self._last = self.start

    def arrived(self, tokens: int, now: float | None = None) -> None:
        if tokens <= 0:
            return
        now = time.perf_counter() if now is None else now
        if self.tokens == 0:
            self.ttft_s = now - self.start
            self.itl_s += [0.0] * (tokens - 1)
        else:
            self.itl_s += [(now - self._last) / tokens] * tokens
        self.tokens += tokens
        self._last = now

    def outcome(self, prompt_len: int, output_tokens: int | None = None, error: str = "") -> RequestOutcome:
        """The request's outcome, ended now. ``output_tokens`` overrides the streamed count (a server's
        usage); ``error`` marks it failed."""
        return RequestOutcome(ok=not error, prompt_len=prompt_len,
                              output_tokens=self.tokens if output_tokens is None else output_tokens,
                              ttft_s=self.ttft_s, latency_s=time.perf_counter() - self.start,
                              itl_s=self.itl_s, start_s=self.start, error=error)

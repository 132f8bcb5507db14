"""The token masks of a step's constrained rows, filled on a worker thread while the model's forward runs.

:meth:`GrammarMasker.start` (the engine calls it before the forward) gives each constrained request that
samples this step a :class:`RequestGrammar` (built or caught up from its output tokens) and queues the
filling of one bitmask for them all; llguidance computes masks without the GIL, so this overlaps the
forward. ``step_sampling`` then takes each row with :func:`allowed_tokens` (waiting for the fill if it is
not done), masks the row's logits, samples, and advances the request's grammar with the token.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from services.engine.request import Request
from services.engine.structured.compiler import StructuredCompiler
from services.engine.structured.matcher import RequestGrammar


@dataclass
class FilledMasks:
    """``allowed[i]``: row i's allowed token ids as booleans over the vocabulary; ``errors``: the rows
    whose grammar could not go on (its message), with no mask."""

    allowed: np.ndarray
    errors: dict[int, str] = field(default_factory=dict)


class PendingMasks:
    def __init__(self, future: Future[FilledMasks]):
        self._future = future

    def row(self, index: int) -> np.ndarray | str:
        """Row ``index``'s allowed tokens, or the error that left it without a mask."""
        filled = self._future.result()
        return filled.errors.get(index) or filled.allowed[index]


class GrammarMasker:
    def __init__(self, compiler: StructuredCompiler | None, vocab_size: int):
        self.compiler = compiler
        self.vocab_size = vocab_size
        self._pool: ThreadPoolExecutor | None = None

    def start(self, requests: Sequence[Request]) -> None:
        """Queue the masks of the constrained ones of ``requests`` (those sampling this step)."""
        constrained = [r for r in requests if r.sampling.structured is not None]
        if not constrained:
            return
        assert self.compiler is not None, "a constrained request passed validation without a compiler"
        states = [self._state(r) for r in constrained]
        outputs = [list(r.output_token_ids) for r in constrained]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        pending = PendingMasks(self._pool.submit(self._fill, states, outputs))
        for i, state in enumerate(states):
            state.pending, state.row = pending, i

    def _state(self, request: Request) -> RequestGrammar:
        spec = request.sampling.structured
        assert spec is not None and self.compiler is not None
        state = request.structured
        if not isinstance(state, RequestGrammar) or state.stale(spec.key, request.output_token_ids):
            state = RequestGrammar(self.compiler.compile(spec), spec.starts_after_token_ids)  # cached: validated
            request.structured = state
        return state

    def _fill(self, states: Sequence[RequestGrammar], outputs: Sequence[list[int]]) -> FilledMasks:
        words = (self.vocab_size + 31) // 32
        bits = np.zeros((len(states), words), dtype=np.int32)
        errors: dict[int, str] = {}
        for i, (state, output) in enumerate(zip(states, outputs, strict=True)):
            if not state.sync(output):
                errors[i] = f"the output so far does not match the grammar: {state.error}"
                continue
            state.fill(bits[i])
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :self.vocab_size].astype(bool)
        for i in range(len(states)):
            if i not in errors and not allowed[i].any():
                errors[i] = f"the grammar allows no next token: {states[i].error or 'dead end'}"
        return FilledMasks(allowed, errors)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def allowed_tokens(request: Request) -> np.ndarray | str:
    """The allowed next tokens of a constrained request :meth:`GrammarMasker.start` prepared this step, or
    the error that leaves it without any."""
    state = request.structured
    if not isinstance(state, RequestGrammar) or state.pending is None:
        raise RuntimeError(f"{request.request_id}: a constrained request sampled without GrammarMasker.start")
    pending, row = state.pending, state.row
    state.pending = None
    return pending.row(row)

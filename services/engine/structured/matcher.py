"""One constrained request's grammar state: its compiled grammar advanced by the request's output tokens.

The state is rebuilt from the spec and the tokens so far whenever it is missing or stale — a new
``Request`` object on a decode node after a commit (the first token came from the prefill node), after an
adoption (a handover), or a state that consumed more tokens than the request holds — and catches up by
replaying the tokens it has not consumed. So the mask of the next token is the same whichever node or
path produced the tokens before it. The state lives in the request's opaque ``Request.structured`` slot
(the control plane never looks inside it) and dies with the request.

A spec with ``starts_after_token_ids`` (a reasoning model's end of thinking: one token, or a run of them)
leaves the output free until those tokens: the grammar sees only the tokens after their first run, and
before it every token is allowed (the mask is all ones).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.engine.errors import InvalidRequestError
from services.engine.structured.compiler import CompiledGrammar


def constrained_start(output_ids: Sequence[int], starts_after: Sequence[int], begin: int = 0) -> int | None:
    """Where the constrained part of ``output_ids`` begins: 0 with no ``starts_after`` tokens, else just past
    their first run (one that starts at ``begin`` or later); None while it has not come."""
    if not starts_after:
        return 0
    size, first = len(starts_after), starts_after[0]
    wanted = list(starts_after)
    for i in range(begin, len(output_ids) - size + 1):
        if output_ids[i] == first and list(output_ids[i:i + size]) == wanted:
            return i + size
    return None


class RequestGrammar:
    """A matcher over ``compiled`` and how many of the request's output tokens it consumed (with
    ``starts_after``: counting the free ones before those tokens)."""

    def __init__(self, compiled: CompiledGrammar, starts_after: Sequence[int] = ()):
        self.key = compiled.key
        self._matcher = compiled.new_matcher()
        self._starts_after = tuple(starts_after)
        self._start: int | None = None if starts_after else 0  # where the grammar's tokens begin
        self._recent: list[int] = []  # the last tokens before the start, as long as ``starts_after`` at most
        self.consumed = 0
        self.pending = None  # the step's masks being filled (masking.PendingMasks), and this request's row
        self.row = -1

    def stale(self, key: str, output_ids: Sequence[int]) -> bool:
        return key != self.key or self.consumed > len(output_ids)

    @property
    def active(self) -> bool:
        """The grammar applies to the next token (the ``starts_after`` tokens, if any, came)."""
        return self._start is not None

    def sync(self, output_ids: Sequence[int]) -> bool:
        """Consume the output tokens not consumed yet; False if the grammar refuses one (an error state)."""
        if self.consumed < len(output_ids):
            if self._start is None:
                begin = max(0, self.consumed - len(self._starts_after) + 1)  # a run may straddle the consumed
                self._start = constrained_start(output_ids, self._starts_after, begin)
                self._recent = list(output_ids[-len(self._starts_after):])
            if self._start is not None and self._start < len(output_ids):
                self._matcher.consume_tokens(list(output_ids[max(self._start, self.consumed):]))
            self.consumed = len(output_ids)
        return not self._matcher.is_error()

    def advance(self, token_id: int) -> bool:
        """Consume the token just sampled; False if the grammar refuses it."""
        self.consumed += 1
        if self._start is None:
            self._recent = [*self._recent, token_id][-len(self._starts_after):]
            if tuple(self._recent) == self._starts_after:
                self._start = self.consumed
            return True
        ok = self._matcher.consume_token(token_id)
        return ok and not self._matcher.is_error()

    def fill(self, row: np.ndarray) -> None:
        """Write the next token's allowed set into ``row`` (int32 words, bit ``i % 32`` of word ``i // 32``)."""
        assert row.dtype == np.int32 and row.flags.c_contiguous
        if self._start is None:
            row.fill(-1)  # free until the starts_after tokens: every bit set
            return
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    @property
    def complete(self) -> bool:
        """Nothing more may follow (the grammar ended, or its EOS was consumed)."""
        return self._start is not None and self._matcher.is_stopped()

    @property
    def error(self) -> str:
        return self._matcher.get_error()


def check_tokens(compiled: CompiledGrammar, token_ids: Sequence[int], field: str,
                 starts_after: Sequence[int] = ()) -> None:
    """Raise :class:`InvalidRequestError` naming ``field`` unless the grammar, from its start, accepts
    ``token_ids`` (tokens made elsewhere: a prefill node's first token, a handed-over request's output) —
    those after the first run of ``starts_after`` tokens, when the spec has them."""
    start = constrained_start(token_ids, starts_after)
    if start is None:
        return
    token_ids = token_ids[start:]
    if not token_ids:
        return
    matcher = compiled.new_matcher()
    if not matcher.consume_tokens(list(token_ids)) or matcher.is_error():
        accepted = compiled.new_matcher().validate_tokens(list(token_ids))
        raise InvalidRequestError(field, f"token {accepted} (id {token_ids[min(accepted, len(token_ids) - 1)]}) "
                                         f"is not allowed by the request's structured output grammar")

"""Incremental detokenisation with stop strings, for streaming text as tokens arrive.

Text is emitted only once it is stable (no trailing replacement character from a split UTF-8 sequence),
and the last ``len(longest stop) - 1`` characters are held back so a stop string is never half-streamed.
With ``min_tokens`` (as vLLM has it) no stop string is looked for until more than that many tokens came:
one that ends within the text of the first ``min_tokens`` tokens does not stop the request.

As vLLM: ``include_stop`` keeps a matched stop string at the end of the text (nothing is held back then),
and the token that ended a request (its end of sequence or a stop token id: ``push(..., ends_on_stop_token=
True)``) has text only with ``include_stop``. ``skip_special_tokens=False`` decodes special tokens' text.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.engine.tokenizer import Tokenizer


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = (), min_tokens: int = 0,
                 include_stop: bool = False, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.min_tokens = min_tokens
        self.include_stop = include_stop
        self.skip_special_tokens = skip_special_tokens
        # a stop string may begin this many characters before new text: held back from the client, unless
        # it is kept in the text anyway (include_stop)
        self._holdback = 0 if include_stop else max((len(s) for s in self.stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self._emitted = 0
        self.matched_stop: str | None = None

    def push(self, token_ids: Sequence[int], ends_on_stop_token: bool = False) -> str:
        """Add new tokens; return newly stable text. After a stop string matched, ``matched_stop`` is set
        and the text ends just before it (with ``include_stop``: just after it). ``ends_on_stop_token``: the
        last of ``token_ids`` ended the request (end of sequence, stop token id): it adds text only with
        ``include_stop``."""
        if self.matched_stop is not None:
            return ""
        if ends_on_stop_token and not self.include_stop:
            token_ids = token_ids[:-1]
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._append(full[len(prefix):])
        return self._release(final=self.matched_stop is not None)

    def flush(self) -> str:
        """All text not yet returned (call when the request finished), tokens still held back for an
        unfinished UTF-8 sequence included: they decode as the tokenizer decodes them (``\ufffd``), so the
        streamed text always equals the decode of all the tokens, cut at a stop string."""
        if self.matched_stop is None and self._read_offset < len(self._ids):
            prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
            full = self._decode(self._ids[self._prefix_offset:])
            self._prefix_offset = self._read_offset = len(self._ids)
            self._append(full[len(prefix):])
        return self._release(final=True)

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def _append(self, delta: str) -> None:
        """Add newly decoded text; look for a stop string that ends in it once more than ``min_tokens``
        tokens came."""
        old_length = len(self.text)
        self.text += delta
        if self.stop and len(self._ids) > self.min_tokens:
            self._check_stop(old_length)

    def _check_stop(self, old_length: int) -> None:
        """The first stop string that ends in the text past ``old_length`` (as vLLM: a shorter one that
        ended in older text, e.g. within the first ``min_tokens`` tokens', is not matched late)."""
        hits = [(self.text.find(s, max(0, old_length - len(s) + 1)), s) for s in self.stop]
        hits = [(pos, s) for pos, s in hits if pos >= 0]
        if hits:
            pos, stop = min(hits)
            self.text = self.text[:pos + len(stop) if self.include_stop else pos]
            self.matched_stop = stop

    def _release(self, final: bool) -> str:
        end = len(self.text) if final or not self.stop else max(self._emitted, len(self.text) - self._holdback)
        out = self.text[self._emitted:end]
        self._emitted = end
        return out

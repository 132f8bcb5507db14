"""The text side of one request's output at the gateway: incremental detokenization, stop strings, usage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.engine.detokenizer import IncrementalDetokenizer
from services.engine.sampling_params import SamplingParams
from services.engine.tokenizer import Tokenizer
from services.gateway.generation import Usage


@dataclass(frozen=True)
class TextDelta:
    """What a batch of new tokens adds to the client's output."""

    token_ids: tuple[int, ...]  # the tokens kept: none past the one that completed a stop string
    text: str
    finish_reason: str  # "stop" when a stop string matched, else the node's reason ("" = not finished)
    stop_matched: str | None  # the stop string this batch completed (None: none, or matched before)

    @property
    def empty(self) -> bool:
        return not self.token_ids and not self.finish_reason and not self.text


class CompletionText:
    """Turns the tokens of one request into text, matching stop strings; counts them for ``usage``.

    Stop strings are the gateway's: a match keeps the tokens up to the one that completed it, drops the
    rest, and finishes the request with ``"stop"`` (the caller aborts the nodes still running it). A request
    a node finished with ``"stop"`` on one of its stop tokens (an end of sequence unless ``ignore_eos``, a
    stop token id) gives that token no text unless ``include_stop_str_in_output``, as vLLM.
    """

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, prompt_tokens: int) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, stop=sampling.stop, min_tokens=sampling.min_tokens,
                                                   include_stop=sampling.include_stop_str_in_output,
                                                   skip_special_tokens=sampling.skip_special_tokens)
        self._stop_tokens = frozenset((*sampling.stop_token_ids,
                                       *(() if sampling.ignore_eos else tokenizer.eos_token_ids)))
        self._prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.cached_tokens = 0

    def add(self, token_ids: Sequence[int], finish_reason: str) -> TextDelta:
        detokenizer = self._detokenizer
        kept: list[int] = []
        text: list[str] = []
        stop_matched = None
        last = len(token_ids) - 1
        for i, token_id in enumerate(token_ids):
            kept.append(token_id)
            ends = i == last and finish_reason == "stop" and token_id in self._stop_tokens  # the node stopped on it
            text.append(detokenizer.push([token_id], ends_on_stop_token=ends))
            if detokenizer.matched_stop is not None:
                finish_reason = "stop"
                stop_matched = detokenizer.matched_stop
                break
        self.completion_tokens += len(kept)
        if finish_reason:
            text.append(detokenizer.flush())
            if detokenizer.matched_stop is not None:  # completed by tokens held back for a split character
                finish_reason = "stop"
        return TextDelta(tuple(kept), "".join(text), finish_reason, stop_matched)

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the output (None: none did)."""
        return self._detokenizer.matched_stop

    def usage(self) -> Usage:
        return Usage(self._prompt_tokens, self.completion_tokens, self.cached_tokens)

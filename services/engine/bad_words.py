"""vLLM's ``bad_words``: words the output may not contain, as token sequences.

Each word is tokenized twice, as vLLM does: as written (its leading spaces stripped) and after one space
(a word in the middle of text), the second kept only when it is another spelling of the same length, not the
first with a space token in front. A sequence of one token bans that token at every step; a longer one bans its
last token where the output so far ends with the rest (so the word can start, but not be completed). Only the
output is matched, not the prompt (vLLM's). Torch-free: the bans join the request's other banned ids
(``step_sampling.banned_ids``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.engine.errors import InvalidRequestError

MAX_BAD_WORDS = 128
MAX_BAD_WORD_CHARS = 256
MAX_BAD_WORD_TOKENS = 64  # a word's tokens; each step matches every sequence's against the output's end

BadWordIds = tuple[tuple[int, ...], ...]


def check_bad_words(words: Sequence[str]) -> None:
    """Raise :class:`InvalidRequestError` naming ``bad_words`` for what cannot be served."""
    if len(words) > MAX_BAD_WORDS:
        raise InvalidRequestError("bad_words", f"at most {MAX_BAD_WORDS} words, got {len(words)}")
    for word in words:  # (their UTF-8 form: checked with the other strings, sampling_params.validate)
        if not word.strip():
            raise InvalidRequestError("bad_words", "a bad word must not be empty or only spaces")
        if len(word) > MAX_BAD_WORD_CHARS:
            raise InvalidRequestError("bad_words", f"a bad word is at most {MAX_BAD_WORD_CHARS} characters, got "
                                                   f"one of {len(word)}")


def bad_word_ids(words: Sequence[str], encode: Callable[[str], list[int]], vocab_size: int) -> BadWordIds:
    """The token sequences of ``words`` (``encode``: text → ids, without special tokens)."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(encode(word.lstrip()))
        if not plain:  # a tokenizer whose normaliser drops every character of it
            raise InvalidRequestError("bad_words", f"{word!r} has no tokens")
        if len(plain) > MAX_BAD_WORD_TOKENS:
            raise InvalidRequestError("bad_words", f"a bad word is at most {MAX_BAD_WORD_TOKENS} tokens, {word[:40]!r}"
                                                   f"… is {len(plain)}")
        sequences.append(plain)
        spaced = tuple(encode(" " + word.lstrip()))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    for sequence in sequences:
        for token_id in sequence:
            if not 0 <= token_id < vocab_size:  # a tokenizer larger than the model's vocabulary
                raise InvalidRequestError("bad_words", f"token {token_id} is outside the vocabulary [0, {vocab_size})")
    return tuple(sequences)


def bad_word_bans(sequences: BadWordIds, output_ids: Sequence[int]) -> tuple[int, ...]:
    """The ids the next token may not be: each sequence's last token where the output ends with the rest."""
    banned = []
    for sequence in sequences:
        prefix = len(sequence) - 1
        if prefix == 0:
            banned.append(sequence[0])
        elif prefix <= len(output_ids) and output_ids[-1] == sequence[-2] \
                and tuple(output_ids[-prefix:]) == sequence[:-1]:  # the last token first: most steps stop there
            banned.append(sequence[-1])
    return tuple(banned)

"""``truncate_prompt_tokens`` in the validator (vLLM's left truncation), on a character tokenizer that puts a
BOS first: the last k tokens are kept, a text prompt keeps its BOS, and what truncation makes fit is not
refused for its length first."""

from __future__ import annotations

import pytest

from services.engine.errors import InvalidRequestError
from services.engine.validation import RequestValidator

BOS = 1


class CharTokenizer:
    """One token a character (its code point), BOS first: what the validator reads of a tokenizer."""

    max_token_chars = 1

    def encode(self, text: str) -> list[int]:
        return [BOS, *(ord(c) for c in text)]


def validator(max_model_len: int = 64) -> RequestValidator:
    return RequestValidator(vocab_size=1000, max_model_len=max_model_len, tokenizer=CharTokenizer())


def test_a_text_prompt_keeps_its_bos_and_its_last_tokens():
    assert validator().encode_prompt("abcdefgh", keep_last=4) == [BOS, *map(ord, "fgh")]
    assert validator().encode_prompt("abc", keep_last=8) == [BOS, *map(ord, "abc")]  # shorter: as it is
    with pytest.raises(InvalidRequestError, match="room for the prompt") as info:
        validator().encode_prompt("abc", keep_last=1)
    assert info.value.field == "truncate_prompt_tokens"


def test_token_ids_are_cut_from_the_left_before_their_length_is_checked():
    ids = list(range(100, 300))  # past the context of 64
    assert validator().encode_prompt(token_ids=ids, keep_last=10) == ids[-10:]
    with pytest.raises(InvalidRequestError, match="do not fit the context"):
        validator().encode_prompt(token_ids=ids)


def test_a_text_past_any_context_is_cut_to_its_end_not_refused():
    text = "x" * 500 + "the end"  # 507 characters: no prompt of at most 64 tokens has them
    with pytest.raises(InvalidRequestError, match="characters"):
        validator().encode_prompt(text)
    assert validator().encode_prompt(text, keep_last=8) == [BOS, *map(ord, "the end")]


@pytest.mark.parametrize("bad", [0, -1, -2, 65])
def test_out_of_range_is_refused_naming_the_field(bad):
    """-1 (the context's room) is resolved by the caller, which knows max_tokens."""
    with pytest.raises(InvalidRequestError) as info:
        validator().encode_prompt("abc", keep_last=bad)
    assert info.value.field == "truncate_prompt_tokens"

"""vLLM's ``bad_words``: each word tokenized as written and after a space (the second only where it is another
spelling of the same length, as vLLM keeps it), a one-token word never sampled, a longer one never completed;
out-of-range input refused naming the field. On the real model (greedy, float32): the banned word's token is
not sampled and the generation goes on otherwise."""

from __future__ import annotations

import pytest

from services.engine.bad_words import (
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    bad_word_bans,
    bad_word_ids,
)
from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine

GREEDY = dict(max_tokens=24, temperature=0, ignore_eos=True)


def test_a_word_is_tokenized_as_written_and_after_a_space(bundled_tokenizer):
    encode, vocab = bundled_tokenizer.encode_plain, bundled_tokenizer.vocab_size
    assert bad_word_ids(["Paris"], encode, vocab) == ((38634,), (7042,))  # "Paris", " Paris"
    assert bad_word_ids(["  Paris"], encode, vocab) == ((38634,), (7042,))  # leading spaces stripped
    # "beautiful" is two tokens, " beautiful" one: vLLM keeps only the first
    assert bad_word_ids(["beautiful"], encode, vocab) == (tuple(encode("beautiful")),)
    with pytest.raises(InvalidRequestError, match=r"outside the vocabulary"):
        bad_word_ids(["Paris"], encode, 100)
    with pytest.raises(InvalidRequestError, match="has no tokens"):  # a normaliser that drops it all
        bad_word_ids(["\u200b"], lambda text: [] if not text.strip(" \u200b") else encode(text), vocab)


def test_a_longer_word_bans_its_last_token_only_after_the_others():
    sequences = ((5,), (7, 8, 9))
    assert bad_word_bans(sequences, []) == (5,)
    assert bad_word_bans(sequences, [1, 7]) == (5,)
    assert bad_word_bans(sequences, [1, 7, 8]) == (5, 9)
    assert bad_word_bans(sequences, [7, 8, 1]) == (5,)


@pytest.mark.parametrize(("words", "message"), [
    ([""], "empty"), (["   "], "empty"), (["x" * (MAX_BAD_WORD_CHARS + 1)], "characters"),
    (["w"] * (MAX_BAD_WORDS + 1), "at most"), (["\U0001f600" * (MAX_BAD_WORD_TOKENS // 2 + 1)], "tokens"),
    (["fine \ud800"], "Unicode"),
])
def test_bad_input_is_refused_naming_the_field(words, message, fp32_model, bundled_tokenizer):
    engine = make_engine(fp32_model, bundled_tokenizer)
    with pytest.raises(InvalidRequestError, match=message) as raised:
        engine.add_request("Hi", SamplingParams(bad_words=tuple(words)))
    assert raised.value.field == "bad_words"
    assert not engine.has_unfinished()


@pytest.mark.slow
def test_the_model_does_not_say_a_banned_word(fp32_model, bundled_tokenizer):
    engine = make_engine(fp32_model, bundled_tokenizer)
    prompt = "The capital of France is"
    (free,) = engine.generate([prompt], SamplingParams(**GREEDY))
    assert free.text.startswith(" Paris")
    (banned,) = engine.generate([prompt], SamplingParams(**GREEDY, bad_words=("Paris",)))
    assert "Paris" not in banned.text and banned.token_ids[0] != free.token_ids[0]
    (other,) = engine.generate([prompt], SamplingParams(**GREEDY, bad_words=("girl",)))
    assert other.token_ids == free.token_ids  # a word it would not say changes nothing
    engine.check_integrity()


@pytest.mark.slow
def test_a_two_token_word_can_start_but_not_be_completed(fp32_model, bundled_tokenizer):
    engine = make_engine(fp32_model, bundled_tokenizer)
    prompt = "Once upon a time, there was a little"
    (free,) = engine.generate([prompt], SamplingParams(**GREEDY))
    assert free.text.startswith(" girl named Emma")
    named, emma = bundled_tokenizer.encode_plain(" named Emma")
    (banned,) = engine.generate([prompt], SamplingParams(**GREEDY, bad_words=("named Emma",)))
    assert banned.token_ids[:2] == free.token_ids[:2] == [free.token_ids[0], named]  # " girl named": allowed
    assert banned.token_ids[2] != emma and "named Emma" not in banned.text
    engine.check_integrity()

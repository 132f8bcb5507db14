"""CompletionText: the gateway's text of a request — stop strings cut the tokens, usage counts what was kept."""

from __future__ import annotations

from services.gateway.completion_text import CompletionText


def test_text_of_all_batches_is_the_decoded_tokens(tokenizer):
    ids = tokenizer.encode("The sea is calm tonight, and the moon is full.")
    text = CompletionText(tokenizer, stop=(), prompt_tokens=7)
    first = text.add(ids[:3], "")
    last = text.add(ids[3:], "length")
    assert first.finish_reason == "" and first.stop_matched is None
    assert last.finish_reason == "length"
    assert first.text + last.text == tokenizer.decode(ids)
    assert text.usage().prompt_tokens == 7 and text.usage().completion_tokens == len(ids)


def test_a_stop_string_drops_the_tokens_after_it_and_finishes_with_stop(tokenizer):
    ids = tokenizer.encode("one two three four five six")
    text = CompletionText(tokenizer, stop=("three",), prompt_tokens=1)
    delta = text.add(ids, "")
    assert delta.stop_matched == "three" and delta.finish_reason == "stop"
    assert "three" not in delta.text and "four" not in delta.text
    assert delta.text.strip() == "one two"
    assert 0 < len(delta.token_ids) < len(ids)
    assert text.usage().completion_tokens == len(delta.token_ids)


def test_a_batch_that_adds_nothing_is_empty(tokenizer):
    text = CompletionText(tokenizer, stop=(), prompt_tokens=1)
    assert text.add([], "").empty
    assert not text.add([], "length").empty  # the finish itself is news

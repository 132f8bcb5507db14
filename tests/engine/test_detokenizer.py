"""Incremental detokenisation and stop strings on the real tokenizer."""

from __future__ import annotations

import pytest

from services.engine.detokenizer import IncrementalDetokenizer

pytestmark = pytest.mark.slow


def test_streamed_text_equals_full_decode(bundled_tokenizer):
    text = "Héllo wörld — naïve café 😀 ends here. 東京"
    ids = bundled_tokenizer.encode(text)
    detok = IncrementalDetokenizer(bundled_tokenizer)
    streamed = "".join(detok.push([t]) for t in ids) + detok.flush()
    assert streamed == bundled_tokenizer.decode(ids) == text
    assert "\ufffd" not in streamed


def test_stop_string_truncates_and_is_never_half_streamed(bundled_tokenizer):
    ids = bundled_tokenizer.encode("one two three STOP four five")
    detok = IncrementalDetokenizer(bundled_tokenizer, stop=("STOP",))
    pieces = []
    for token in ids:
        pieces.append(detok.push([token]))
        if detok.matched_stop:
            break
    pieces.append(detok.flush())
    assert detok.matched_stop == "STOP"
    assert "".join(pieces) == "one two three "
    assert all("S" not in p for p in pieces)


@pytest.mark.parametrize("text", ["café 😀", "ok 😀😀", "東京"])
@pytest.mark.parametrize("stop", [(), ("zz",)])
def test_generation_ending_inside_a_character_still_streams_the_full_decode(bundled_tokenizer, text, stop):
    """max_tokens can end a request after the first bytes of a character: the held-back tokens come out at
    flush as the tokenizer decodes them (complete characters sharing those tokens, like the space before the
    emoji, are not lost)."""
    ids = bundled_tokenizer.encode(text)[:-1]
    detok = IncrementalDetokenizer(bundled_tokenizer, stop=stop)
    streamed = "".join(detok.push([t]) for t in ids) + detok.flush()
    assert streamed == bundled_tokenizer.decode(ids)
    assert detok.flush() == ""


def test_a_stop_string_completed_by_the_held_back_tokens_is_found_at_flush(bundled_tokenizer):
    ids = bundled_tokenizer.encode("go 😀")[:-1]
    tail = bundled_tokenizer.decode(ids)[-2:]  # ends in the replacement character of the cut emoji
    detok = IncrementalDetokenizer(bundled_tokenizer, stop=(tail,))
    streamed = "".join(detok.push([t]) for t in ids) + detok.flush()
    assert detok.matched_stop == tail
    assert streamed == bundled_tokenizer.decode(ids)[:-2]


def test_a_stop_string_within_the_first_min_tokens_tokens_does_not_match(bundled_tokenizer):
    ids = bundled_tokenizer.encode(" STOP one STOP two")
    first_stop_tokens = len(bundled_tokenizer.encode(" STOP"))
    detok = IncrementalDetokenizer(bundled_tokenizer, stop=("STOP",), min_tokens=first_stop_tokens)
    text = ""
    for token in ids:
        text += detok.push([token])
        if detok.matched_stop:
            break
    text += detok.flush()
    assert detok.matched_stop == "STOP" and text == " STOP one "


@pytest.mark.parametrize("include_stop", [False, True])
def test_a_short_stop_string_that_ended_in_the_first_min_tokens_is_not_matched_later(bundled_tokenizer, include_stop):
    """Only a stop string that ends in new text matches (as vLLM), whatever the longest stop string's length:
    with include_stop nothing is held back, so a late match would cut text the client already has."""
    ids = bundled_tokenizer.encode("one two three four five six seven")
    detok = IncrementalDetokenizer(bundled_tokenizer, stop=("two", "x" * 20), min_tokens=3, include_stop=include_stop)
    streamed = ""
    for token in ids:
        streamed += detok.push([token])
        if detok.matched_stop:
            break
    streamed += detok.flush()
    assert detok.matched_stop is None and streamed == detok.text == bundled_tokenizer.decode(ids)

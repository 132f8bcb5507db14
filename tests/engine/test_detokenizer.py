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

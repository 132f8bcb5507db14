"""CompletionText: the gateway's text of a request — stop strings cut the tokens, usage counts what was kept."""

from __future__ import annotations

from services.engine.sampling_params import SamplingParams
from services.gateway.completion_text import CompletionText


def _text(tokenizer, **sampling) -> CompletionText:
    return CompletionText(tokenizer, SamplingParams(**sampling), prompt_tokens=1)


def test_text_of_all_batches_is_the_decoded_tokens(tokenizer):
    ids = tokenizer.encode("The sea is calm tonight, and the moon is full.")
    text = CompletionText(tokenizer, SamplingParams(), prompt_tokens=7)
    first = text.add(ids[:3], "")
    last = text.add(ids[3:], "length")
    assert first.finish_reason == "" and first.stop_matched is None
    assert last.finish_reason == "length"
    assert first.text + last.text == tokenizer.decode(ids)
    assert text.usage().prompt_tokens == 7 and text.usage().completion_tokens == len(ids)


def test_a_stop_string_drops_the_tokens_after_it_and_finishes_with_stop(tokenizer):
    ids = tokenizer.encode("one two three four five six")
    text = _text(tokenizer, stop=("three",))
    delta = text.add(ids, "")
    assert delta.stop_matched == "three" and delta.finish_reason == "stop"
    assert "three" not in delta.text and "four" not in delta.text
    assert delta.text.strip() == "one two"
    assert 0 < len(delta.token_ids) < len(ids)
    assert text.usage().completion_tokens == len(delta.token_ids)


def test_a_batch_that_adds_nothing_is_empty(tokenizer):
    text = _text(tokenizer)
    assert text.add([], "").empty
    assert not text.add([], "length").empty  # the finish itself is news


def test_include_stop_str_in_output_keeps_the_stop_string_and_the_same_tokens(tokenizer):
    ids = tokenizer.encode("one two three four five six")
    cut = _text(tokenizer, stop=("three",)).add(ids, "")
    kept = _text(tokenizer, stop=("three",), include_stop_str_in_output=True).add(ids, "")
    assert kept.text.strip() == "one two three" and kept.finish_reason == "stop" and kept.stop_matched == "three"
    assert kept.token_ids == cut.token_ids


def test_a_stop_string_split_across_batches_is_found_and_streamed_whole_with_include_stop(tokenizer):
    ids = tokenizer.encode("one two three four five six")
    text = _text(tokenizer, stop=("two three",), include_stop_str_in_output=True)
    deltas = []
    for token in ids:  # as the gateway streams: one token a batch, until the request finishes
        deltas.append(text.add([token], ""))
        if deltas[-1].finish_reason:
            break
    assert deltas[-1].stop_matched == "two three" and len(deltas) < len(ids)
    assert "".join(d.text for d in deltas).strip() == "one two three"


def test_the_stop_token_that_ended_a_request_has_no_text_unless_included(tokenizer):
    ids = tokenizer.encode("one two three")
    three = ids[-1]
    for include, expected in ((False, "one two"), (True, "one two three")):
        text = _text(tokenizer, stop_token_ids=(three,), include_stop_str_in_output=include)
        delta = text.add(ids, "stop")  # the node stopped on it
        assert delta.text.strip() == expected and delta.token_ids == tuple(ids)
        assert text.usage().completion_tokens == len(ids)
    # the same token where the request ended for its length is text like any other
    assert _text(tokenizer, stop_token_ids=(three,)).add(ids, "length").text.strip() == "one two three"


def test_special_tokens_have_text_only_without_skip_special_tokens(tokenizer):
    eos = tokenizer.eos_token_ids[0]
    start = tokenizer.hf.convert_tokens_to_ids("<|im_start|>")
    ids = [start, *tokenizer.encode("hi"), eos]
    spelled = tokenizer.hf.convert_ids_to_tokens(eos)
    assert _text(tokenizer).add(ids, "stop").text == "hi"
    shown = _text(tokenizer, skip_special_tokens=False).add(ids, "stop").text
    assert shown == "<|im_start|>hi"  # the end of sequence that stopped it: no text (vLLM)
    assert _text(tokenizer, skip_special_tokens=False, include_stop_str_in_output=True).add(
        ids, "stop").text == f"<|im_start|>hi{spelled}"
    # with ignore_eos the end of sequence did not stop the request: it is text
    assert _text(tokenizer, skip_special_tokens=False, ignore_eos=True).add(ids, "length").text.endswith(spelled)

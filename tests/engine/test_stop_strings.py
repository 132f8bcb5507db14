"""Stop strings in the mixed engine: the text ends just before the stop string, the finish reason is
``stop`` and ``stop_reason`` names it, also when the token that completes it is the last one allowed;
vLLM's ``include_stop_str_in_output`` and ``skip_special_tokens`` change the text, never the tokens."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.sampling_params import SamplingParams
from tests.conftest import make_engine

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine(fp32_model, bundled_tokenizer):
    return make_engine(fp32_model, bundled_tokenizer)


@pytest.fixture(scope="module")
def free_run(engine):
    """The greedy continuation without stop strings: its token ids and the text of each prefix."""
    result = engine.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    texts = [engine.tokenizer.decode(result.token_ids[:n]) for n in range(len(result.token_ids) + 1)]
    return result.token_ids, texts


def run(engine, max_tokens: int, stop: str):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, stop=(stop,))
    return engine.generate([PROMPT], params)[0]


@pytest.mark.parametrize("max_tokens", [6, 2], ids=["mid-generation", "on-the-last-allowed-token"])
def test_a_stop_string_ends_the_text_before_it_with_reason_stop(engine, free_run, max_tokens):
    token_ids, texts = free_run
    stop = texts[2][len(texts[1]):].strip()  # the second token's text completes the stop string
    assert stop and stop not in texts[1], texts
    result = run(engine, max_tokens, stop)
    assert result.token_ids == token_ids[:2]
    assert result.text == texts[2][:texts[2].index(stop)]
    assert (result.finish_reason, result.stop_reason) == ("stop", stop)
    engine.check_integrity()


def test_without_a_match_the_last_allowed_token_is_a_length_finish(engine, free_run):
    token_ids, texts = free_run
    result = run(engine, 2, "never in this text")
    assert result.token_ids == token_ids[:2]
    assert (result.text, result.finish_reason, result.stop_reason) == (texts[2], "length", None)


def test_min_tokens_keeps_stop_strings_and_eos_from_ending_the_request_early(engine, free_run):
    token_ids, texts = free_run
    stop = texts[2][len(texts[1]):].strip()  # completed by the second token
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, stop=(stop,), min_tokens=3)
    result = engine.generate([PROMPT], params)[0]
    assert result.token_ids == token_ids[:len(result.token_ids)] and len(result.token_ids) > 3
    later = texts[6].find(stop, len(texts[3]) - len(stop) + 1)  # a match that ends after the third token
    if later < 0:
        assert (result.text, result.finish_reason) == (texts[6], "length")
    else:
        assert (result.text, result.finish_reason) == (texts[6][:later], "stop")
    # EOS: a chat turn ends early unless min_tokens holds it open
    chat = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n"
    short = engine.generate([chat], SamplingParams(max_tokens=40, temperature=0))[0]
    assert short.finish_reason == "stop" and len(short.token_ids) < 20, short
    held = engine.generate([chat], SamplingParams(max_tokens=40, temperature=0, min_tokens=20))[0]
    assert len(held.token_ids) >= 20
    assert held.token_ids[:len(short.token_ids) - 1] == short.token_ids[:-1]  # the same until EOS was banned
    engine.check_integrity()


def test_include_stop_str_in_output_keeps_the_stop_string_and_the_stop_token(engine, free_run):
    token_ids, texts = free_run
    stop = texts[2][len(texts[1]):].strip()
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, stop=(stop,), include_stop_str_in_output=True)
    kept = engine.generate([PROMPT], params)[0]
    assert kept.token_ids == token_ids[:2] and kept.text == texts[2][:texts[2].index(stop) + len(stop)]
    # a stop token id: its text is cut, as vLLM, unless included
    by_token = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, stop_token_ids=(token_ids[2],))
    cut = engine.generate([PROMPT], by_token)[0]
    with_it = engine.generate([PROMPT], dataclasses.replace(by_token, include_stop_str_in_output=True))[0]
    assert cut.token_ids == with_it.token_ids == token_ids[:3]
    assert (cut.text, with_it.text) == (texts[2], texts[3])
    assert (cut.finish_reason, cut.stop_reason) == ("stop", token_ids[2])


def test_skip_special_tokens_false_shows_them_but_not_the_end_of_sequence_that_stopped(engine):
    chat = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n"
    plain = engine.generate([chat], SamplingParams(max_tokens=40, temperature=0))[0]
    shown = engine.generate([chat], SamplingParams(max_tokens=40, temperature=0, skip_special_tokens=False))[0]
    assert plain.finish_reason == shown.finish_reason == "stop" and plain.token_ids == shown.token_ids
    assert shown.text == plain.text  # a turn of plain text: only its end of sequence is special, and it is cut
    spelled = engine.tokenizer.hf.convert_ids_to_tokens(plain.token_ids[-1])
    both = engine.generate([chat], SamplingParams(max_tokens=40, temperature=0, skip_special_tokens=False,
                                                  include_stop_str_in_output=True))[0]
    assert both.text == plain.text + spelled and spelled == "<|im_end|>"

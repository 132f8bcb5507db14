"""Sampler: greedy, temperature, top-k, top-p, min-p, penalties, seeds, banned ids."""

from __future__ import annotations

import pytest
import torch

from services.engine.penalties import apply_logit_bias, apply_min_p, apply_penalties
from services.engine.sampler import make_generator, sample
from services.engine.sampling_params import SamplingParams, as_float32


def _logits(rows: int = 2, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_takes_argmax():
    logits = _logits()
    params = [SamplingParams(temperature=0.0)] * 2
    assert sample(logits, params, [None, None]) == logits.argmax(-1).tolist()


def test_a_temperature_below_1e_5_is_greedy():
    """Dividing logits by 1e-40 would overflow float32 (softmax NaN, token 0); below 1e-5 is greedy, as vLLM."""
    logits = _logits(3) * 30
    params = [SamplingParams(temperature=t, seed=1) for t in (1e-6, 1e-38, 1e-40)]
    assert all(p.greedy for p in params)
    assert sample(logits, params, [make_generator(p) for p in params]) == logits.argmax(-1).tolist()
    assert not SamplingParams(temperature=1e-5).greedy
    # what a node reads from the wire (float32) is as greedy as what the engine was given
    for t in (1e-5, 9.9999e-6, 1.00001e-5):
        assert SamplingParams(temperature=as_float32(t)).greedy == SamplingParams(temperature=t).greedy, t


def test_top_k_one_is_greedy_even_at_high_temperature():
    logits = _logits(4)
    params = [SamplingParams(temperature=5.0, top_k=1, seed=i) for i in range(4)]
    assert sample(logits, params, [make_generator(p) for p in params]) == logits.argmax(-1).tolist()


def test_top_k_only_picks_among_the_k_best():
    logits = _logits(1, 100)
    allowed = set(logits[0].topk(5).indices.tolist())
    params = SamplingParams(temperature=3.0, top_k=5, seed=1)
    generator = make_generator(params)
    picks = {sample(logits.clone(), [params], [generator])[0] for _ in range(200)}
    assert picks <= allowed and len(picks) > 1


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    params = SamplingParams(temperature=1.0, top_p=0.8, seed=3)
    generator = make_generator(params)
    picks = {sample(logits.clone(), [params], [generator])[0] for _ in range(300)}
    assert picks == {0, 1}


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    logits = _logits(3, 1000)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone = sample(logits[:1].clone(), [seeded], [make_generator(seeded)])
    others = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0)]
    together = sample(logits.clone(), [seeded, *others], [make_generator(seeded), None, None])
    assert together[0] == alone[0]


def test_sampling_follows_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    params = SamplingParams(temperature=1.0, seed=7)
    generator = make_generator(params)
    counts = torch.zeros(3)
    for _ in range(3000):
        counts[sample(logits.clone(), [params], [generator])[0]] += 1
    expected = logits.softmax(-1)[0] * 3000
    assert torch.allclose(counts, expected, rtol=0.1), (counts, expected)


def test_banned_ids_are_never_chosen():
    logits = torch.tensor([[0.0, 10.0, 1.0]])
    assert sample(logits, [SamplingParams(temperature=0.0)], [None], banned=[[1]]) == [2]


def test_penalties_follow_vllms_formulas_and_touch_only_penalized_rows():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]] * 2)
    prompt, output = [0, 1], [3, 3, 2]  # token 3 twice, token 2 once; tokens 0 and 1 only in the prompt
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    penalized = logits[0].clone()
    apply_penalties(logits, [params, SamplingParams(temperature=0.0)], [(prompt, output), None])
    # repetition over prompt and output (positive / 2, negative * 2), then frequency × count, then presence
    assert logits[0].tolist() == [1.0, -2.0, 0.25 - 0.5 - 0.25, 1.5 - 1.0 - 0.25, -2.0]
    assert torch.equal(logits[1], penalized)  # no penalty: untouched


def test_penalties_change_a_greedy_choice():
    logits = torch.tensor([[0.0, 5.0, 4.0]])
    repeated = SamplingParams(temperature=0.0, frequency_penalty=2.0)
    assert sample(logits.clone(), [repeated], [None], histories=[([0], [])]) == [1]  # nothing generated yet
    assert sample(logits.clone(), [repeated], [None], histories=[([0], [1])]) == [2]  # 5 - 2 < 4
    assert sample(logits.clone(), [SamplingParams(temperature=0.0, repetition_penalty=1.5)], [None],
                  histories=[([1], [])]) == [2]  # 5 / 1.5 < 4: a prompt token is penalized too
    assert sample(logits.clone(), [SamplingParams(temperature=0.0, presence_penalty=-2.0)], [None],
                  histories=[([0], [2])]) == [2]  # a negative penalty encourages repeats


def test_min_p_drops_the_tokens_less_likely_than_min_p_times_the_likeliest():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = [SamplingParams(temperature=1.0, min_p=0.35, seed=s) for s in range(300)]
    picked = {sample(logits.clone(), [p], [make_generator(p)])[0] for p in params}
    assert picked == {0, 1}  # 0.15 < 0.35 × 0.5: tokens 2 and 3 never drawn; without min_p they are
    plain = [SamplingParams(temperature=1.0, seed=s) for s in range(300)]
    assert {sample(logits.clone(), [p], [make_generator(p)])[0] for p in plain} == {0, 1, 2, 3}
    assert apply_min_p(logits, [1.0]).isfinite().tolist() == [[True, False, False, False]]


def test_a_penalized_row_without_its_history_is_a_bug_not_a_silent_no_op():
    with pytest.raises(AssertionError, match="histories"):
        sample(_logits(1), [SamplingParams(temperature=0.0, repetition_penalty=1.2)], [None])


def test_logit_bias_is_added_before_the_penalties_greedy_rows_included():
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]])
    assert sample(logits.clone(), [SamplingParams(temperature=0.0, logit_bias=((1, -100.0),))], [None]) == [2]
    assert sample(logits.clone(), [SamplingParams(temperature=0.0, logit_bias=((0, 100.0),))], [None]) == [0]
    both = SamplingParams(temperature=0.0, logit_bias=((2, 2.0), (2, 1.5)), repetition_penalty=2.0)
    biased = logits.clone()
    apply_logit_bias(biased, [both])
    assert biased.tolist() == [[0.0, 5.0, 7.5, 1.0]]  # a token listed twice gets both biases
    apply_penalties(biased, [both], [([2], [])])
    assert biased.tolist() == [[0.0, 5.0, 3.75, 1.0]]  # (4 + 3.5) / 2: the bias first, then the penalty
    untouched = logits.clone()
    apply_logit_bias(untouched, [SamplingParams()])
    assert torch.equal(untouched, logits)


def test_top_k_and_top_p_leave_the_rows_that_do_not_ask_for_them_whole():
    """A row without top-k beside one with it keeps every token (and costs no full sort); a row with
    top_p 1 beside one below keeps its far tail, which float32's cumulative sum reaches 1.0 before."""
    from services.engine.sampler import _apply_top_k, _apply_top_p

    logits = _logits(3, 100)
    limited = _apply_top_k(logits, [2, 0, 1000])
    assert limited.isfinite().sum(-1).tolist() == [2, 100, 100]
    tail = torch.tensor([[0.0] + [-100.0] * 9, [0.0, -0.1] + [-100.0] * 8])
    assert (tail[0].softmax(-1).cumsum(-1)[0] == 1.0).item()  # the tail is below float32's rounding of 1
    kept = _apply_top_p(tail, [1.0, 0.5])
    assert kept[0].isfinite().all() and kept[1].isfinite().tolist() == [True] + [False] * 9

"""Sampler: greedy, temperature, top-k, top-p, seeds, banned ids."""

from __future__ import annotations

import torch

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

"""Sampling where the logits are: the batched bias and penalties (``device_penalties``, what an accelerator
runs) give the bits of the host's numpy ones, row for row, whatever mix of settings a batch holds; and on
a GPU (skipped without one) a whole step is sampled there with the host's tokens and logprobs."""

from __future__ import annotations

import random

import pytest
import torch

from services.engine.device_penalties import apply_logit_bias_batched, apply_penalties_batched
from services.engine.penalties import apply_logit_bias, apply_penalties
from services.engine.request import Request
from services.engine.sampler import make_generator, sample, sample_ids
from services.engine.sampling_params import SamplingParams
from services.engine.step_sampling import sample_step

VOCAB = 300


def _mixed_batch(seed: int) -> tuple[torch.Tensor, list[SamplingParams], list]:
    """Rows with every penalty alone and together, none, and histories sharing tokens between prompt and
    output, repeating output tokens, or empty outputs."""
    rng = random.Random(seed)
    settings = [dict(), dict(repetition_penalty=1.3), dict(frequency_penalty=0.7), dict(presence_penalty=-0.4),
                dict(repetition_penalty=0.8, frequency_penalty=1.1, presence_penalty=0.3),
                dict(frequency_penalty=0.5, presence_penalty=0.5)]
    params, histories = [], []
    for row in range(12):
        p = SamplingParams(temperature=0.0, **settings[row % len(settings)])
        prompt = sorted(set(rng.randrange(VOCAB) for _ in range(rng.randrange(1, 40))))
        output = [rng.choice(prompt) if rng.random() < 0.3 else rng.randrange(VOCAB)
                  for _ in range(rng.choice([0, 1, 5, 30]))]
        params.append(p)
        histories.append((prompt, output) if p.penalized else None)
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(seed)) * 4
    return logits, params, histories


@pytest.mark.parametrize("seed", range(5))
def test_batched_penalties_give_the_numpy_bits(seed: int) -> None:
    logits, params, histories = _mixed_batch(seed)
    host, batched = logits.clone(), logits.clone()
    apply_penalties(host, params, histories)
    apply_penalties_batched(batched, params, histories)
    assert torch.equal(host, batched)
    assert not torch.equal(host, logits)  # the penalties did something
    untouched = [row for row, p in enumerate(params) if not p.penalized]
    assert torch.equal(batched[untouched], logits[untouched])


def test_batched_logit_bias_gives_the_numpy_bits_a_token_listed_twice_included() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(logit_bias=((5, 0.1), (7, -3.5), (5, 0.2))), SamplingParams(),
              SamplingParams(logit_bias=((0, 100.0), (VOCAB - 1, 1e-3)))]
    host, batched = logits.clone(), logits.clone()
    apply_logit_bias(host, params)
    apply_logit_bias_batched(batched, params)
    assert torch.equal(host, batched)
    assert batched[0, 5] == (logits[0, 5] + 0.1) + 0.2 and torch.equal(batched[1], logits[1])
    nothing = logits.clone()
    apply_logit_bias_batched(nothing, [SamplingParams()] * 3)
    assert torch.equal(nothing, logits)


def test_a_penalized_row_without_history_is_refused_by_the_batched_version_too() -> None:
    with pytest.raises(AssertionError, match="history"):
        apply_penalties_batched(torch.zeros(1, 4), [SamplingParams(repetition_penalty=1.2)], [None])


def test_sample_ids_leaves_the_ids_on_the_logits_device_and_sample_is_its_host_list() -> None:
    logits, params, histories = _mixed_batch(7)
    params = [*params[:6], *(SamplingParams(temperature=0.9, top_p=0.9, top_k=20, seed=s) for s in range(6))]
    histories = [*histories[:6], *([None] * 6)]
    generators = [make_generator(p, 3) for p in params]
    ids = sample_ids(logits.clone(), params, generators, histories=histories)
    assert ids.dtype == torch.long and ids.device == logits.device
    again = sample(logits.clone(), params, [make_generator(p, 3) for p in params], histories=histories)
    assert ids.tolist() == again  # seeded rows: the same draws


cuda = pytest.mark.gpu  # skipped where CUDA is absent


def _request(name: str, params: SamplingParams, output: list[int] = ()) -> Request:
    request = Request(name, [5, 6, 7, 11], params, eos_token_ids=(2,))
    request.output_token_ids.extend(output)
    return request


@cuda
def test_a_gpu_step_gets_the_host_tokens_and_logprobs_for_every_deterministic_setting() -> None:
    """Greedy rows with bias, penalties, banned ids and logprobs, and random rows with top_k 1: the same
    tokens on the GPU as on the host, from the same logits; logprobs within float32 rounding."""
    logits = torch.randn(6, 32000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    requests = [
        _request("plain", SamplingParams(temperature=0.0)),
        _request("penalized", SamplingParams(temperature=0.0, repetition_penalty=3.0, frequency_penalty=1.0,
                                             presence_penalty=0.5), output=[int(logits[1].float().argmax())] * 3),
        _request("biased", SamplingParams(temperature=0.0, logit_bias=((123, 50.0),))),
        _request("min-tokens", SamplingParams(temperature=0.0, min_tokens=3)),
        _request("logprobs", SamplingParams(temperature=0.0, logprobs=5)),
        _request("top-k-1", SamplingParams(temperature=1.5, top_k=1, seed=4)),
    ]
    logits[3, 2] = logits[3].max() + 1  # EOS on top of a row that may not end yet
    host = sample_step(logits.clone(), requests)
    device = sample_step(logits.cuda(), requests)
    assert device.tokens == host.tokens and device.tokens["biased"] == 123 and device.tokens["min-tokens"] != 2
    (gpu_entry,), (cpu_entry,) = device.logprobs.values(), host.logprobs.values()
    assert gpu_entry.token_id == cpu_entry.token_id
    assert gpu_entry.logprob == pytest.approx(cpu_entry.logprob, abs=1e-4)
    assert [t for t, _ in gpu_entry.top] == [t for t, _ in cpu_entry.top]


@cuda
def test_seeded_gpu_sampling_reproduces_and_does_not_depend_on_the_batch() -> None:
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(2), device="cpu").cuda()
    seeded = SamplingParams(temperature=1.0, top_p=0.95, min_p=0.01, seed=99)
    others = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.2, top_k=50),
              SamplingParams(temperature=0.0)]
    alone = sample(logits[:1].clone(), [seeded], [make_generator(seeded, 5, logits.device)])
    together = sample(logits.clone(), [seeded, *others], [make_generator(seeded, 5, logits.device), None, None, None])
    assert together[0] == alone[0] and together[3] == int(logits[3].argmax())
    top_k = SamplingParams(temperature=5.0, top_k=3, seed=1)
    allowed = set(logits[0].topk(3).indices.tolist())
    picks = {sample(logits[:1].clone(), [top_k], [make_generator(top_k, i, logits.device)])[0] for i in range(100)}
    assert picks <= allowed and len(picks) > 1


@cuda
def test_a_gpu_step_of_every_mode_waits_for_the_device_once() -> None:
    """Host values cross through pinned memory and the ids and logprobs come back together: one
    synchronizing call in the whole step (``torch.cuda.set_sync_debug_mode`` counts them)."""
    import warnings

    logits = torch.randn(7, 32000, generator=torch.Generator().manual_seed(3)).cuda()
    requests = [
        _request("plain", SamplingParams(temperature=0.0)),
        _request("penalized", SamplingParams(temperature=0.7, repetition_penalty=1.2, frequency_penalty=0.5,
                                             presence_penalty=0.5), output=[9, 9, 4]),
        _request("biased", SamplingParams(temperature=0.0, logit_bias=((123, 5.0), (123, 1.0)))),
        _request("min-tokens", SamplingParams(temperature=0.0, min_tokens=3)),
        _request("logprobs", SamplingParams(temperature=0.0, logprobs=5)),
        _request("top-p", SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05)),
        _request("seeded top-k", SamplingParams(temperature=0.8, top_k=40, seed=3, logprobs=2)),
    ]
    sample_step(logits.clone(), requests)  # warm: pinned blocks cached, kernels loaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            samples = sample_step(logits.clone(), requests)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchronizing" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert set(samples.logprobs) == {"logprobs", "seeded top-k"} and len(samples.tokens) == 7


@cuda
def test_a_token_biased_twice_gets_the_numpy_bits_on_the_gpu() -> None:
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(logit_bias=((5, 0.1), (7, -3.5), (5, 0.2), (5, 1e-3))), SamplingParams()]
    host, device = logits.clone(), logits.cuda()
    apply_logit_bias(host, params)
    apply_logit_bias_batched(device, params)
    assert torch.equal(device.cpu(), host)

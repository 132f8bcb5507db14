"""``sample_step``: plain greedy rows take their argmax where the logits are (only ids cross to the host);
every other row goes through ``sample`` on the host. A batch mixing every kind of row must get exactly the
tokens and logprobs of sending the whole batch through ``sample``."""

from __future__ import annotations

import torch

from services.engine.logprob_compute import token_logprobs
from services.engine.request import Request
from services.engine.sampler import make_generator, sample
from services.engine.sampling_params import SamplingParams
from services.engine.step_sampling import banned_ids, sample_step

VOCAB = 64
EOS = 2


def _request(name: str, params: SamplingParams, output: list[int] = ()) -> Request:
    request = Request(name, [5, 6, 7], params, eos_token_ids=(EOS,))
    request.output_token_ids.extend(output)
    return request


def _batch() -> tuple[torch.Tensor, list[Request]]:
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    top = logits.float().argmax(-1).tolist()
    logits[6, 40] = logits[6, 50] = logits[6].max() + 1  # a tie: the first index wins
    logits[4, EOS] = logits[4].max() + 1  # EOS on top of a row that may not end yet
    greedy = SamplingParams(temperature=0.0)
    requests = [
        _request("plain", greedy),
        _request("logprobs", SamplingParams(temperature=0.0, logprobs=3)),
        _request("seeded", SamplingParams(temperature=0.8, top_k=10, seed=11)),
        _request("penalized", SamplingParams(temperature=0.0, repetition_penalty=50.0), output=[top[3]]),
        _request("min-tokens", SamplingParams(temperature=0.0, min_tokens=4)),
        _request("biased", SamplingParams(temperature=0.0, logit_bias=((9, 100.0),))),
        _request("tie", greedy),
        _request("plain-too", greedy),
    ]
    return logits, requests


def _reference(logits: torch.Tensor, requests: list[Request]) -> tuple[list[int], dict]:
    host = logits.cpu()
    raw = host.clone()
    params = [r.sampling for r in requests]
    histories = [(r.distinct_prompt_ids, r.output_token_ids) if r.sampling.penalized else None for r in requests]
    tokens = sample(host, params, [make_generator(r.sampling, r.num_output_tokens) for r in requests],
                    [banned_ids(r) for r in requests], histories)
    wanted = [i for i, r in enumerate(requests) if r.sampling.logprobs is not None]
    rows = token_logprobs(raw[wanted], [tokens[i] for i in wanted], [requests[i].sampling.logprobs for i in wanted])
    return tokens, {requests[i].request_id: row for i, row in zip(wanted, rows, strict=True)}


def test_a_mixed_batch_gets_what_the_host_sampler_gives() -> None:
    logits, requests = _batch()
    tokens, logprobs = _reference(logits, requests)
    samples = sample_step(logits, requests)
    assert [samples.tokens[r.request_id] for r in requests] == tokens
    assert samples.logprobs == logprobs and list(logprobs) == ["logprobs"]
    assert tokens[6] == 40  # the tie
    assert tokens[4] != EOS and tokens[5] == 9  # banned before min_tokens; forced by the bias
    assert tokens[3] != logits[3].float().argmax().item()  # the penalty moved it


def test_an_all_greedy_batch_and_a_batch_with_no_greedy_row() -> None:
    logits, requests = _batch()
    plain = [requests[i] for i in (0, 6, 7)]
    rows = logits[[0, 6, 7]]
    assert list(sample_step(rows, plain).tokens.values()) == rows.float().argmax(-1).tolist()
    others = [requests[i] for i in (1, 2, 3)]
    rows = logits[[1, 2, 3]]
    assert list(sample_step(rows, others).tokens.values()) == _reference(rows, others)[0]

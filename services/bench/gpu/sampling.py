"""A step's sampling on one device (see ``gpu.suite``): :func:`step_sampling.sample_step` on logits that
stay where the model left them, against the route before issue 29 (every row that is not plain greedy
copied to the host and sampled there), for the sampling modes applications use, at several batch sizes of
a Llama-3 vocabulary (128256). Each figure is the median of ``repeats`` timed steps, both routes in the
same call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.bench.gpu.decode import sync
from services.engine.request import Request
from services.engine.sampling_params import SamplingParams
from services.engine.step_sampling import sample_step

VOCAB = 128256
MODES: dict[str, Callable[[int], SamplingParams]] = {
    "greedy": lambda i: SamplingParams(temperature=0.0),
    "temperature + top-p": lambda i: SamplingParams(temperature=0.8, top_p=0.95),
    "top-k + min-p, seeded": lambda i: SamplingParams(temperature=0.7, top_k=50, min_p=0.05, seed=i),
    "penalties (512-token prompts)": lambda i: SamplingParams(temperature=0.0, repetition_penalty=1.1,
                                                              frequency_penalty=0.5, presence_penalty=0.5),
    "greedy + 5 logprobs": lambda i: SamplingParams(temperature=0.0, logprobs=5),
}
"""What each row of a batch asks for, by mode (``i``: the row)."""


@dataclass(frozen=True)
class SamplingResult:
    mode: str
    batch: int
    device_ms: float
    host_ms: float
    """The route before issue 29: the rows' logits copied to the host, sampled there."""


def sampling_times(device: str, batches: list[int], repeats: int, vocab: int = VOCAB) -> list[SamplingResult]:
    results = []
    generator = torch.Generator().manual_seed(0)
    for mode, make in MODES.items():
        for batch in batches:
            requests = [_request(i, make(i), vocab) for i in range(batch)]
            logits = (torch.randn(batch, vocab, generator=generator) * 3).to(device)
            on_device = _median(lambda x=logits, rs=requests: sample_step(x.clone(), rs), device, repeats)
            on_host = _median(lambda x=logits, rs=requests: sample_step(x.clone().cpu(), rs), device, repeats)
            results.append(SamplingResult(mode, batch, on_device, on_host))
    return results


def _request(i: int, params: SamplingParams, vocab: int) -> Request:
    prompt = [(i * 7919 + j * 104729) % vocab for j in range(512)]
    request = Request(f"r{i}", prompt, params, eos_token_ids=(0,))
    request.output_token_ids.extend(prompt[:64])
    return request


def _median(step: Callable[[], object], device: str, repeats: int) -> float:
    step()  # warm: kernels chosen, allocator primed
    times = []
    for _ in range(repeats):
        sync(device)
        started = time.perf_counter()
        step()  # returns host ints: the step's own sync
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)

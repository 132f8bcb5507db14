"""Where an engine decode step's time goes: the host's Python (cProfile) and the device's kernels.

    python -m services.bench.gpu.profile_step [--preset smollm2-135m] [--batches 1 32] [--device cuda]

Random weights of a preset shape, ``batch`` greedy requests of 1024 random prompt tokens
(``gpu.decode.decoding_engine``). After 30 warm steps: the wall time of 20 steps, a cProfile of 20
more (the top functions by cumulative time), and on CUDA a torch-profiler table of 5 more (kernels by
device time). On the H200 the SmolLM2 shape at batch 1 ran 1.6 ms of kernels per 12.8 ms step: the step
is host-bound (``docs/benchmarks.md``, GPU path).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from services.bench.gpu.decode import decoding_engine
from services.engine.random_llama import PRESETS, random_model

PROMPT_LEN = 1024


def profile(preset: str, batch: int, device: str, prompt_len: int = PROMPT_LEN, top: int = 28) -> float:
    """Print the profiles of ``batch`` decoding requests; returns the wall ms of one step."""
    model = random_model(PRESETS[preset], torch.bfloat16, device, seed=1)
    engine = decoding_engine(model, batch, prompt_len, max_tokens=200)
    for _ in range(30):
        engine.step()
    _sync(device)
    started = time.perf_counter()
    for _ in range(20):
        engine.step()
    _sync(device)
    ms = (time.perf_counter() - started) / 20 * 1e3
    print(f"\n### {preset}, batch {batch}, {device}: {ms:.2f} ms/step", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        engine.step()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)
    if device == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as trace:
            for _ in range(5):
                engine.step()
            torch.cuda.synchronize()
        print(trace.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    return ms


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smollm2-135m", choices=sorted(PRESETS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    for batch in args.batches:
        profile(args.preset, batch, args.device)


if __name__ == "__main__":
    main()

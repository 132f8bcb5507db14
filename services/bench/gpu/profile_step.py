"""Where an engine decode step's time goes: the host's Python (cProfile) and the device's kernels.

    python -m services.bench.gpu.profile_step [--preset smollm2-135m] [--batches 1 32] [--device cuda]
                                              [--modes unfused eager graphs]

Random weights of a preset shape, ``batch`` greedy requests of 1024 random prompt tokens
(``gpu.decode.decoding_engine``), each mode in turn: ``unfused`` (eager with torch's elementwise ops: the step
before issue 29), ``eager`` (FlashInfer's fused ops where they passed their load check), ``graphs`` (those,
replayed from CUDA graphs). After 30
warm steps: the wall time of 20 steps, a cProfile of 20 more (the top functions by cumulative time), and
on CUDA a torch-profiler table of 5 more (kernels by device time). Last, one line per mode and batch:
host ms per step, kernel launches per step and GPU ms per step (the kernels' summed device time). On the
H200 the SmolLM2 shape at batch 1, eager, ran 1.6 ms of kernels per 12.8 ms step: the step is host-bound
(``docs/benchmarks.md``, GPU path).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from kernels.fused_ops import torch_ops
from services.bench.gpu.decode import decoding_engine, sync
from services.common.logging import setup_logging
from services.engine.random_llama import PRESETS, random_model

MODES = ("unfused", "eager", "graphs")

PROMPT_LEN = 1024
PROFILED_STEPS = 5


def profile(model, batch: int, device: str, graphs: bool, prompt_len: int = PROMPT_LEN, top: int = 28,
            mode: str = "") -> dict[str, float]:
    """Print the profiles of ``batch`` decoding requests; returns host ms, launches and GPU ms per step
    (``mode``: the label, by default ``graphs`` or ``eager``)."""
    engine = decoding_engine(model, batch, prompt_len, max_tokens=200, graphs=graphs)
    for _ in range(30):
        engine.step()
    sync(device)
    started = time.perf_counter()
    for _ in range(20):
        engine.step()
    sync(device)
    ms = (time.perf_counter() - started) / 20 * 1e3
    mode = mode or ("graphs" if graphs else "eager")
    print(f"\n### batch {batch}, {mode}, {device}: {ms:.2f} ms/step", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        engine.step()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)
    summary = {"batch": batch, "graphs": graphs, "mode": mode, "host_ms": ms, "launches": 0.0, "gpu_ms": 0.0}
    if device == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as trace:
            for _ in range(PROFILED_STEPS):
                engine.step()
            torch.cuda.synchronize()
        print(trace.key_averages().table(sort_by="cuda_time_total", row_limit=12))
        kernels = [e for e in trace.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        summary["launches"] = len(kernels) / PROFILED_STEPS
        summary["gpu_ms"] = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / PROFILED_STEPS
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smollm2-135m", choices=sorted(PRESETS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = parser.parse_args()
    setup_logging(fmt="console")  # the engine's log lines on stderr: stdout is the markdown report
    model = random_model(PRESETS[args.preset], torch.bfloat16, args.device, seed=1)
    fused, unfused = model.ops, torch_ops(model.rope, model.dtype)
    rows = []
    for batch in args.batches:
        for mode in args.modes:
            model.ops = unfused if mode == "unfused" else fused
            rows.append(profile(model, batch, args.device, mode == "graphs", mode=mode))
    model.ops = fused
    print(f"\n{args.preset}, one decode step (host ms: wall time of 20 steps; launches and GPU ms: means over "
          f"{PROFILED_STEPS} profiled steps; fused ops in use: {', '.join(fused.flashinfer) or 'none'})\n\n"
          f"| batch | steps | host ms/step | launches/step | GPU ms/step |\n| ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['batch']} | {r['mode']} | {r['host_ms']:.2f} | {r['launches']:.0f} | {r['gpu_ms']:.2f} |")


if __name__ == "__main__":
    main()

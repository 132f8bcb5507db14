"""Scheduling simulator: the real :class:`Scheduler` and block pool, driven by simulated step costs.

No model runs: every sampled token is a dummy id and a step costs ``base + per_token × batched tokens +
per_context × decode context tokens (+ per_swapped × tokens copied out or in)`` simulated milliseconds. A
closed-loop client keeps ``concurrency`` requests in the system (a new one arrives when one finishes).
Compares admission policies at scale in seconds of wall time:

    python -m services.bench.sim                       # FastDeploy's workload, a pool where memory binds
    python -m services.bench.sim --requests 200 --num-blocks 4000 --policies new_token_ratio none

Reported per policy: preemptions, recomputed tokens, makespan in steps and in simulated seconds, mean
TPOT and mean TTFT (simulated ms). Control plane only: no torch, no gRPC.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass

from kvcache.hashing import model_fingerprint
from kvcache.manager import KVCacheManager
from services.engine.admission import POLICIES, AdmissionConfig, make_policy
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.step_batch import SchedulerConfig, StepBatch


@dataclass(frozen=True)
class Workload:
    requests: int = 1000
    mean_input: int = 1280
    mean_output: int = 700
    seed: int = 0

    def generate(self) -> list[tuple[list[int], int]]:
        """``(prompt ids, max_tokens)`` pairs: lengths uniform on [1, 2 × mean - 1], random token ids (no
        shared prefixes, so the prefix cache does not blur the comparison)."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.requests):
            n_in = rng.randint(1, 2 * self.mean_input - 1)
            n_out = rng.randint(1, 2 * self.mean_output - 1)
            out.append(([rng.randrange(1, 50_000) for _ in range(n_in)], n_out))
        return out


@dataclass(frozen=True)
class StepCost:
    base_ms: float = 8.0
    per_token_ms: float = 0.04  # per batched token (prefill chunks and decode tokens alike)
    per_context_ms: float = 0.0002  # per KV token a decode reads
    per_swapped_ms: float = 0.0005  # per token of KV copied out or back in

    def of(self, batch: StepBatch, block_size: int) -> float:
        context = sum(s.start for s in batch.scheduled if s.num_new_tokens == 1)
        swapped = block_size * (sum(len(s.block_ids) for s in batch.swap_out)
                                + sum(len(s.block_ids) for s in batch.swap_in))
        return (self.base_ms + self.per_token_ms * batch.num_tokens + self.per_context_ms * context
                + self.per_swapped_ms * swapped)


class UnlimitedOffload:
    """Every victim's KV is kept (as with a large host budget); copies cost ``StepCost.per_swapped_ms``."""

    def __init__(self) -> None:
        self.kept: set[str] = set()

    def claim(self, request_id: str, num_blocks: int) -> bool:
        self.kept.add(request_id)
        return True

    def ready(self, request_id: str) -> bool | None:
        return True if request_id in self.kept else None

    def prefetch(self, request_id: str) -> None:
        pass

    def discard(self, request_id: str) -> None:
        self.kept.discard(request_id)


@dataclass(frozen=True)
class SimResult:
    policy: str
    preemptions: int
    recomputed_tokens: int
    makespan_steps: int
    makespan_s: float
    mean_tpot_ms: float
    mean_ttft_ms: float
    wall_s: float


def simulate(workload: list[tuple[list[int], int]], admission: AdmissionConfig, *, num_blocks: int,
             block_size: int = 16, concurrency: int = 256, max_num_batched_tokens: int = 2048,
             cost: StepCost = StepCost(), offload: bool = False) -> SimResult:
    started = time.perf_counter()
    kv = KVCacheManager(num_blocks, block_size, model_fingerprint(model="sim"))
    offloader = UnlimitedOffload() if offload else None
    scheduler = Scheduler(SchedulerConfig(concurrency, max_num_batched_tokens, max_model_len=1 << 30), kv,
                          admission=make_policy(admission), offloader=offloader)
    pending = deque(enumerate(workload))
    in_system, clock_ms, steps, recomputed = 0, 0.0, 0, 0
    arrival: dict[str, float] = {}
    tpots, ttfts = [], []
    while pending or scheduler.has_unfinished():
        while pending and in_system < concurrency:
            i, (prompt, max_tokens) = pending.popleft()
            request = Request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            scheduler.add(request)
            arrival[request.request_id] = clock_ms
            in_system += 1
        batch = scheduler.schedule()
        if not batch:
            raise RuntimeError(f"scheduler stalled at step {steps} with {len(scheduler.waiting)} waiting")
        recomputed += sum(s.num_new_tokens for s in batch.scheduled  # a preempted request's prefill again
                          if s.request.num_preemptions and s.request.status is RequestStatus.RUNNING_PREFILL)
        clock_ms += cost.of(batch, block_size)
        steps += 1
        scheduler.release_swapped(batch)
        for swap in batch.swap_in:
            offloader.discard(swap.request_id)
        for request in scheduler.update(batch, {s.request.request_id: 1 for s in batch.scheduled if s.samples}):
            if request.num_output_tokens == 1:
                request.first_token_time = clock_ms
                ttfts.append(clock_ms - arrival[request.request_id])
            if request.status.finished:
                in_system -= 1
                if request.num_output_tokens > 1:
                    tpots.append((clock_ms - request.first_token_time) / (request.num_output_tokens - 1))
    kv.check_integrity()
    assert kv.num_free_blocks == num_blocks, "the simulated run leaked blocks"
    return SimResult(admission.policy, scheduler.stats.preemptions_total, recomputed, steps, clock_ms / 1000,
                     statistics.fmean(tpots), statistics.fmean(ttfts), time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.bench.sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--mean-input", type=int, default=1280)
    parser.add_argument("--mean-output", type=int, default=700)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=16_384, help="KV pool (16-token blocks)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--offload", action="store_true", help="keep preempted KV (resume) instead of recompute")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    workload = Workload(args.requests, args.mean_input, args.mean_output, args.seed).generate()
    results = [simulate(workload, AdmissionConfig(policy=policy), num_blocks=args.num_blocks,
                        block_size=args.block_size, concurrency=args.concurrency,
                        max_num_batched_tokens=args.max_num_batched_tokens, offload=args.offload)
               for policy in args.policies]
    best = min(r.makespan_steps for r in results)
    print(f"{args.requests} requests, input ~{args.mean_input}, output ~{args.mean_output}, concurrency "
          f"{args.concurrency}, {args.num_blocks} blocks × {args.block_size} tokens, "
          f"{'offload' if args.offload else 'recompute'} on preemption")
    print("| policy | preemptions | recomputed tokens | makespan (steps) | vs best | makespan (sim s) "
          "| mean TPOT (ms) | mean TTFT (s) | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.policy} | {r.preemptions} | {r.recomputed_tokens} | {r.makespan_steps} | "
              f"{r.makespan_steps / best - 1:+.1%} | {r.makespan_s:.1f} | {r.mean_tpot_ms:.1f} | "
              f"{r.mean_ttft_ms / 1000:.1f} | {r.wall_s:.1f} |")


if __name__ == "__main__":
    main()

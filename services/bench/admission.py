"""``make bench-admission``: the decode node's admission policies on a real cluster, memory binding.

For each policy a fresh cluster (gateway, prefill, decode processes, bundled model in bf16) runs the same
workload: ``--requests`` greedy requests with random prompts and output lengths, ``--concurrency`` of them
in flight at a time, against a decode pool of ``--decode-blocks`` blocks (small enough that the running
requests outgrow it). Reported per policy: preemptions on the decode node (KV kept in host memory and
resumed), makespan (wall seconds for the whole workload) and mean TPOT (client-side, from the first to the
last token of each request). Policies alternate within each repeat; medians over ``--repeats``.

    python -m services.bench.admission --repeats 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.engine.admission import POLICIES


def _workload(args: argparse.Namespace) -> list[tuple[list[int], int]]:
    rng = random.Random(args.seed)
    return [([rng.randrange(100, 49000) for _ in range(rng.randint(args.min_input, args.max_input))],
             rng.randint(args.min_output, args.max_output)) for _ in range(args.requests)]


def _one(stub: gateway_pb2_grpc.GatewayStub, prompt: list[int], max_tokens: int) -> float:
    """TPOT in seconds of one request."""
    times = []
    request = gateway_pb2.GenerateRequest(token_ids=prompt, sampling=gateway_pb2.SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    for response in stub.Generate(request, timeout=600):
        times += [time.perf_counter()] * len(response.token_ids)
    return (times[-1] - times[0]) / max(1, len(times) - 1)


def run_policy(policy: str, workload: list[tuple[list[int], int]], args: argparse.Namespace) -> dict[str, float]:
    engine = ("--dtype", "bfloat16", "--threads", "1", "--max-num-batched-tokens", "512")
    spec = ClusterSpec(cache_store=False, engine_args=engine,
                       decode_args=("--num-kv-blocks", str(args.decode_blocks), "--admission-policy", policy),
                       prefill_args=("--num-kv-blocks", "2048"))
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster, \
            grpc.insecure_channel(cluster.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        started = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            tpots = list(pool.map(lambda item: _one(stub, *item), workload))
        makespan = time.perf_counter() - started
        decode = next(n for n in stub.ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10).nodes
                      if n.role == "decode")
    return {"preemptions": decode.preemptions_total, "resumes": decode.resumes_total,
            "recomputes": decode.recomputes_total, "makespan_s": makespan,
            "mean_tpot_ms": 1000 * statistics.fmean(tpots)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.bench.admission",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--min-input", type=int, default=64)
    parser.add_argument("--max-input", type=int, default=320)
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=160)
    parser.add_argument("--decode-blocks", type=int, default=160)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="", help="also write the raw runs here")
    args = parser.parse_args(argv)
    workload = _workload(args)
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in args.policies}
    for repeat in range(args.repeats):
        for policy in args.policies:
            runs[policy].append(run_policy(policy, workload, args))
            print(f"repeat {repeat + 1} {policy}: {runs[policy][-1]}", flush=True)
    print(f"\n{args.requests} requests, input {args.min_input}-{args.max_input}, output {args.min_output}-"
          f"{args.max_output}, concurrency {args.concurrency}, decode pool {args.decode_blocks} blocks × 16; "
          f"medians of {args.repeats}")
    print("| policy | preemptions | resumes | recomputes | makespan (s) | mean TPOT (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for policy, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(f"| {policy} | {med['preemptions']:.0f} | {med['resumes']:.0f} | {med['recomputes']:.0f} | "
              f"{med['makespan_s']:.1f} | {med['mean_tpot_ms']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=2)


if __name__ == "__main__":
    main()

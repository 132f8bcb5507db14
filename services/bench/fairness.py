"""``make bench-fairness``: how long a large prompt waits for a decode reservation while small requests keep
coming, this checkout against ``--baseline-ref`` (before the decode node kept blocks for the oldest
refused request, ``services/engine/reserve_waiters.py``).

Each run is a fresh cluster (gateway, prefill, decode, bundled model in float32, one torch thread each)
whose decode node has ``--decode-blocks`` blocks of 16 tokens. ``--workers`` clients loop short greedy
requests; after ``--warmup-s`` one large greedy request (a prompt of about 180 tokens and 100 new tokens:
most of the pool) is sent. Reported: its latency under that load, how many small requests finished while
it waited, and its latency on the idle cluster afterwards. Baseline and this checkout alternate within
each repeat; medians over ``--repeats``.

    python -m services.bench.fairness --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from pathlib import Path

import grpc
import grpc.aio
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.bench.observability import baseline_checkout
from services.cluster.local import ClusterSpec, start_cluster

PARAGRAPH = ("The history of the lighthouse keepers along the northern coast is a long one. For generations, "
             "families lived in small stone houses beside the towers, trimming the wicks, polishing the great "
             "lenses and writing in their logbooks every ship that passed, every storm that came in from the "
             "sea, and every change of the wind. The keepers were often cut off for weeks in winter, and their "
             "children learned to read by the light of the lamp. ")
LARGE_PROMPT = PARAGRAPH * 2 + "Summarize."


async def _generate(stub: gateway_pb2_grpc.GatewayStub, prompt: str, max_tokens: int, timeout_s: float) -> int:
    sampling = gateway_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tokens = 0
    async for response in stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, sampling=sampling),
                                        timeout=timeout_s):
        tokens += len(response.token_ids)
    return tokens


async def _measure(address: str, args: argparse.Namespace) -> dict[str, float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        stop, small_done = asyncio.Event(), [0]

        async def small(worker: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    await _generate(stub, f"Story number {worker}-{i}: once upon a time", 40, 120)
                    small_done[0] += 1
                except grpc.aio.AioRpcError:
                    pass
                i += 1

        workers = [asyncio.create_task(small(w)) for w in range(args.workers)]
        await asyncio.sleep(args.warmup_s)
        started, before = time.perf_counter(), small_done[0]
        try:
            await _generate(stub, LARGE_PROMPT, 100, args.timeout_s)
            loaded_s = time.perf_counter() - started
        except grpc.aio.AioRpcError:
            loaded_s = float("inf")  # refused until its deadline
        passed = small_done[0] - before
        stop.set()
        await asyncio.gather(*workers)
        started = time.perf_counter()
        await _generate(stub, LARGE_PROMPT, 100, args.timeout_s)
        return {"loaded_s": loaded_s, "small_meanwhile": passed, "idle_s": time.perf_counter() - started}


def run(cwd: Path | None, args: argparse.Namespace) -> dict[str, float]:
    # plaintext inside (insecure): this measures scheduling, and the baseline predates internal mTLS
    spec = ClusterSpec(cache_store=False, engine_args=("--dtype", "float32", "--threads", "1"),
                       decode_args=("--num-kv-blocks", str(args.decode_blocks)), cwd=cwd, insecure=True)
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster:
        return asyncio.run(_measure(cluster.address, args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.bench.fairness",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-ref", default="703ba1d", help="the commit before reservation fairness")
    parser.add_argument("--decode-blocks", type=int, default=24)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this checkout": []}
    with baseline_checkout(args.baseline_ref) as baseline:
        for repeat in range(args.repeats):
            for name, cwd in (("baseline", baseline), ("this checkout", None)):
                runs[name].append(run(cwd, args))
                print(f"repeat {repeat + 1} {name}: {runs[name][-1]}", flush=True)
    print(f"\ndecode pool {args.decode_blocks} blocks × 16, {args.workers} clients looping 40-token requests, "
          f"one ~180-token prompt with 100 new tokens; medians of {args.repeats}")
    print("| code | large request under load (s) | small requests finished meanwhile | large request idle (s) |")
    print("|---|---:|---:|---:|")
    for name, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(f"| {name} | {med['loaded_s']:.1f} | {med['small_meanwhile']:.0f} | {med['idle_s']:.1f} |")


if __name__ == "__main__":
    main()

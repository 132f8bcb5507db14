"""``make bench-routing``: cache-aware vs load-only routing on a multi-tenant workload (issue 27).

Per run, a fresh cluster of processes on loopback (bundled model): gateway, two prefill nodes (no shared
cache-store, so a prefix is reused only where it was computed), two decode nodes. ``--requests`` calls,
``--concurrency`` at a time, each one of ``--systems`` system prompts of ``--system-tokens`` random tokens
plus its own ``--question-tokens`` question, in a seeded random order (the same in every run), greedy,
``--output-tokens`` new tokens. The gateway runs ``--routing cache_aware`` or ``--routing load``; the two
alternate run by run (the order flips each round), so what drifts on the machine lands on both.

Measured per run: prompt tokens the prefill nodes computed (their admitted prompt tokens minus those served
from their prefix caches, from ``ClusterStatus``), the prefix hit rate (tokens), and TTFT p50/p99 over the
calls. Medians over ``--rounds``; the goals: ≥ 1.5× fewer prompt tokens computed and TTFT p50 ≤ 0.8× with
cache-aware routing. A Markdown table is printed and the numbers written to ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import time

import grpc
import grpc.aio
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.bench.pd import _prompt
from services.bench.report import write_json
from services.cluster.local import ClusterSpec, start_cluster

POLICIES = ("cache_aware", "load")


def workload(args: argparse.Namespace) -> list[list[int]]:
    systems = [_prompt(7000 + s, args.system_tokens) for s in range(args.systems)]
    order = random.Random(args.seed)
    return [systems[order.randrange(args.systems)] + _prompt(9000 + i, args.question_tokens)
            for i in range(args.requests)]


async def _calls(address: str, prompts: list[list[int]], args: argparse.Namespace) -> list[float]:
    """Every call's TTFT in seconds."""
    sampling = gateway_pb2.SamplingParams(max_tokens=args.output_tokens, temperature=0, ignore_eos=True)
    gate = asyncio.Semaphore(args.concurrency)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(ids: list[int]) -> float:
            async with gate:
                started = time.perf_counter()
                first: float | None = None
                async for _ in stub.Generate(gateway_pb2.GenerateRequest(token_ids=ids, sampling=sampling),
                                             timeout=900):
                    first = first if first is not None else time.perf_counter() - started
                assert first is not None
                return first

        return list(await asyncio.gather(*(one(ids) for ids in prompts)))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_run(policy: str, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    gateway = ("--routing", policy, "--routing-load-margin", str(args.load_margin))
    spec = ClusterSpec(num_prefill=2, num_decode=2, cache_store=False, gateway_args=gateway,
                       engine_args=("--dtype", args.dtype, "--max-num-batched-tokens", "512"),
                       prefill_args=("--threads", "1"), decode_args=("--threads", "1"))
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster, grpc.insecure_channel(cluster.address) as ch:
        ttfts = asyncio.run(_calls(cluster.address, prompts, args))
        time.sleep(2.0)  # ClusterStatus answers from a poll up to a second old (--status-max-age-s)
        status = gateway_pb2_grpc.GatewayStub(ch).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=30)
    prefill = [n for n in status.nodes if n.role == "prefill"]
    if sum(n.requests_total for n in prefill) != len(prompts):
        raise RuntimeError(f"the prefill nodes counted {[n.requests_total for n in prefill]} requests, not "
                           f"{len(prompts)}: a stale status")
    prompt_tokens = sum(n.prompt_tokens_total for n in prefill)
    hits = sum(n.prefix_hit_tokens_total for n in prefill)
    return {"prompt_tokens_computed": prompt_tokens - hits, "prefix_hit_rate": hits / max(prompt_tokens, 1),
            "ttft_p50_ms": 1000 * _percentile(ttfts, 0.5), "ttft_p99_ms": 1000 * _percentile(ttfts, 0.99),
            "requests_per_prefill_node": [n.requests_total for n in prefill]}


def measure(args: argparse.Namespace) -> dict[str, dict]:
    prompts = workload(args)
    runs: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
    for round_ in range(args.rounds):
        for policy in POLICIES if round_ % 2 == 0 else POLICIES[::-1]:
            runs[policy].append(one_run(policy, prompts, args))
            print(f"round {round_} {policy}: {runs[policy][-1]}", flush=True)
    keys = ("prompt_tokens_computed", "prefix_hit_rate", "ttft_p50_ms", "ttft_p99_ms")
    return {policy: {**{k: statistics.median(r[k] for r in runs[policy]) for k in keys}, "runs": runs[policy]}
            for policy in POLICIES}


def table(results: dict[str, dict], args: argparse.Namespace) -> str:
    aware, load = results["cache_aware"], results["load"]
    rows = [("Prompt tokens computed", "{:,.0f}", "prompt_tokens_computed"),
            ("Prefix hit rate (tokens)", "{:.1%}", "prefix_hit_rate"),
            ("TTFT p50 (ms)", "{:.0f}", "ttft_p50_ms"), ("TTFT p99 (ms)", "{:.0f}", "ttft_p99_ms")]
    lines = [f"{args.requests} calls at concurrency {args.concurrency}: {args.systems} system prompts of "
             f"{args.system_tokens} tokens + {args.question_tokens}-token questions, {args.output_tokens} output "
             f"tokens; 2 prefill + 2 decode nodes; --routing-load-margin {args.load_margin}; medians of "
             f"{args.rounds} rounds", "",
             "| | load | cache_aware | cache_aware / load |", "|---|---|---|---|"]
    for label, form, key in rows:
        ratio = aware[key] / load[key] if load[key] else float("nan")
        lines.append(f"| {label} | {form.format(load[key])} | {form.format(aware[key])} | {ratio:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--systems", type=int, default=8, help="distinct system prompts")
    parser.add_argument("--system-tokens", type=int, default=1024, help="tokens of each system prompt")
    parser.add_argument("--question-tokens", type=int, default=32, help="tokens of each call's question")
    parser.add_argument("--output-tokens", type=int, default=8, help="new tokens per call")
    parser.add_argument("--requests", type=int, default=64, help="calls per run")
    parser.add_argument("--concurrency", type=int, default=16, help="calls at once")
    parser.add_argument("--rounds", type=int, default=3, help="runs per policy (alternating)")
    parser.add_argument("--seed", type=int, default=0, help="of the calls' order")
    parser.add_argument("--load-margin", type=int, default=16, help="the gateway's --routing-load-margin")
    parser.add_argument("--json", default="out/bench-routing.json")
    args = parser.parse_args(argv)
    results = measure(args)
    print(table(results, args))
    write_json(args.json, {"args": vars(args), **results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

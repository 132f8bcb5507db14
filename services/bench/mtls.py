"""``make bench-mtls``: what internal mTLS costs against plaintext, measured in one run, alternating.

Two clusters of the bundled model (gateway, prefill node, decode node) run side by side, alike but for the
internal plane: one with mTLS (certificates of a throwaway CA that this process holds too), one with
``--insecure``. Every measure alternates between them run by run (the order flips each round), so what
drifts on the machine lands on both:

(a) KV stream throughput P→D: this process streams the KV of a ``--kv-tokens`` prompt into the cluster's
    decode node as its prefill node does (``pd.kv_stream_once``: reserve, ``TransferKV`` in 4 MiB
    messages, commit, every acknowledgement; with a prefill certificate on the mTLS side): MB/s of KV moved.
(b) TTFT of a ``--ttft-tokens`` (512) token prompt through gateway → prefill → decode, each prompt fresh
    (no prefix hit).
(c) Output tokens/s at concurrency ``--concurrency`` (16): that many ``Generate`` calls at once, each
    ``--output-tokens`` tokens (ignore_eos), total output tokens over the wall time of the batch.

For (a) it also reads the CPU time of every thread at both ends over each timed stream (``thread_cpu``):
this process (the sender) and the decode node (the receiver), each split into Python threads and gRPC's own
threads, in CPU seconds per GB moved. On a machine whose cores the stream saturates, the throughput ratio
can be no better than the ratio of CPU per GB; the split shows what the TLS costs, and on which threads.
``--pin-ends`` runs (a) with this process on one half of the CPUs and the cluster on the other, as if sender
and receiver were two hosts of that many cores each.

Medians of ``--repeats`` runs per side are printed as a Markdown table (mTLS, plaintext, ratio) beside the
goal (issue 25: mTLS keeps ≥ 85% of the plaintext KV throughput, adds ≤ 5% to TTFT) and written to ``--json``.
The gateway's public port is plaintext in both clusters: only the internal plane differs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc, node_pb2

from services.bench.pd import _prompt, kv_layout_of, kv_stream_once
from services.bench.security import BenchCA, bench_ca
from services.bench.thread_cpu import cpu_between, pin, thread_cpu
from services.cluster.local import ClusterSpec, LocalCluster, start_cluster
from services.common.tls.identity import Identity

SIDES = ("mtls", "plaintext")


@dataclass
class Side:
    """One cluster and what was measured on it."""

    name: str
    cluster: LocalCluster
    prefill_identity: Identity | None  # how this process streams KV into its decode node (None: plaintext)
    runs: dict[str, list[float]] = field(default_factory=lambda: {"kv_mb_per_s": [], "ttft_s": [],
                                                                   "output_tokens_per_s": []})
    kv_cpu: dict[str, list[float]] = field(default_factory=dict)  # "sender python" → CPU s/GB, run by run


def _spec(args: argparse.Namespace, ca: BenchCA) -> ClusterSpec:
    node_args = ("--dtype", args.dtype, *shlex.split(args.node_args))
    blocks = str(args.decode_blocks)
    return ClusterSpec(cache_store=False, engine_args=node_args, prefill_args=("--threads", str(args.threads)),
                       decode_args=("--threads", "1", "--num-kv-blocks", blocks),
                       insecure=ca.root is None, mtls_dir=ca.root)


def kv_stream(side: Side, layout: node_pb2.KVLayout, seed: int, tokens: int) -> float:
    """(a): MB/s of one prompt's KV streamed into the side's decode node; the CPU both ends spent on it
    goes to ``side.kv_cpu``."""
    ends = {"sender": os.getpid(), "receiver": side.cluster.decode[0].process.pid}
    readings: dict[bool, dict[str, dict]] = {}

    def on_window(start: bool) -> None:
        readings[start] = {end: thread_cpu(pid) for end, pid in ends.items()}

    size, seconds = asyncio.run(kv_stream_once(side.cluster.decode[0].address, layout, seed, tokens,
                                               side.prefill_identity, on_window))
    for end in ends:
        for kind, spent in cpu_between(readings[True][end], readings[False][end]).items():
            side.kv_cpu.setdefault(f"{end} {kind}", []).append(spent / size * 1e9)
    return size / seconds / 1e6


@contextlib.contextmanager
def ends_pinned(sides: list[Side], enabled: bool):
    """With ``enabled``: this process on the first half of the CPUs it may use, every cluster process on the
    other half, until the block ends."""
    cpus = sorted(os.sched_getaffinity(0))
    if not enabled:
        yield
        return
    if len(cpus) < 2:
        raise SystemExit("--pin-ends needs at least 2 CPUs")
    half = len(cpus) // 2
    pids = [process.process.pid for side in sides for _, process in side.cluster.processes()]
    pin(os.getpid(), set(cpus[:half]))
    for pid in pids:
        pin(pid, set(cpus[half:]))
    try:
        yield
    finally:
        for pid in [os.getpid(), *pids]:
            pin(pid, set(cpus))


def ttft(side: Side, seed: int, tokens: int) -> float:
    """(b): seconds to the first token of a fresh ``tokens``-token prompt."""
    request = gateway_pb2.GenerateRequest(token_ids=_prompt(seed, tokens),
                                          sampling=gateway_pb2.SamplingParams(max_tokens=2, temperature=0))
    with grpc.insecure_channel(side.cluster.address) as channel:  # the gateway's public port
        started = time.perf_counter()
        stream = gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120)
        next(stream)
        first = time.perf_counter() - started
        for _ in stream:
            pass
    return first


async def _output_rate(address: str, seed: int, args: argparse.Namespace) -> float:
    sampling = gateway_pb2.SamplingParams(max_tokens=args.output_tokens, temperature=0, ignore_eos=True)
    async with grpc.aio.insecure_channel(address) as channel:  # the gateway's public port
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(i: int) -> int:
            request = gateway_pb2.GenerateRequest(token_ids=_prompt(seed * 1000 + i, args.prompt_tokens),
                                                  sampling=sampling)
            return sum([len(r.token_ids) async for r in stub.Generate(request, timeout=600)])

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(args.concurrency)))
        return sum(counts) / (time.perf_counter() - started)


def output_rate(side: Side, seed: int, args: argparse.Namespace) -> float:
    """(c): output tokens/s of ``--concurrency`` calls at once."""
    return asyncio.run(_output_rate(side.cluster.address, seed, args))


def alternate(sides: list[Side], measure: str, repeats: int, run: Callable[[Side, int], float]) -> None:
    """``repeats`` rounds of ``run`` on every side; the order flips each round; one warm-up round first. Each
    run gets its own seed (fresh prompts: no prefix hit)."""
    offset = 100_000 * list(sides[0].runs).index(measure)
    for round_ in range(repeats + 1):
        order = sides if round_ % 2 == 0 else sides[::-1]
        for index, side in enumerate(order):
            time.sleep(0.3)  # let the other side's nodes settle: they share the cores
            value = run(side, offset + 1000 * (round_ + 1) + 100 * index)
            if round_:
                side.runs[measure].append(value)


def measure(args: argparse.Namespace, layout: node_pb2.KVLayout) -> dict[str, dict[str, float | list[float]]]:
    with contextlib.ExitStack() as stack:
        sides = []
        for name in SIDES:
            ca = stack.enter_context(bench_ca(insecure=name == "plaintext"))
            cluster = stack.enter_context(start_cluster(_spec(args, ca), stderr=subprocess.DEVNULL))
            sides.append(Side(name, cluster, ca.identity("prefill")))
        with ends_pinned(sides, args.pin_ends):
            alternate(sides, "kv_mb_per_s", args.repeats,
                      lambda s, seed: kv_stream(s, layout, seed, args.kv_tokens))
        for side in sides:  # drop the warm-up round's readings
            side.kv_cpu = {key: runs[-args.repeats:] for key, runs in side.kv_cpu.items()}
        if not args.kv_only:
            alternate(sides, "ttft_s", args.repeats, lambda s, seed: ttft(s, seed, args.ttft_tokens))
            alternate(sides, "output_tokens_per_s", args.repeats, lambda s, seed: output_rate(s, seed, args))
    return {side.name: {**{m: statistics.median(v) for m, v in side.runs.items() if v},
                        **{f"runs_{m}": v for m, v in side.runs.items()},
                        "kv_cpu_s_per_gb": {key: statistics.median(v) for key, v in side.kv_cpu.items()}}
            for side in sides}


def table(results: dict, args: argparse.Namespace, layout: node_pb2.KVLayout) -> str:
    secure, plain = results["mtls"], results["plaintext"]
    kv_mib = -(-args.kv_tokens // layout.block_size) * layout.bytes_per_block / 2**20
    rows = [(f"KV stream P→D, {args.kv_tokens}-token prompt (~{kv_mib:.0f} MiB), MB/s", "kv_mb_per_s", "{:.0f}",
             "≥ 0.85"),
            (f"TTFT, {args.ttft_tokens}-token prompt, ms", "ttft_s", "{:.0f}", "≤ 1.05"),
            (f"output tokens/s, concurrency {args.concurrency}", "output_tokens_per_s", "{:.1f}", "")]
    pinned = ", sender and receiver pinned to separate CPUs" if args.pin_ends else ""
    lines = [f"dtype={args.dtype}, prefill threads={args.threads}, medians of {args.repeats} alternating runs"
             f"{pinned}\n",
             "| measure | mTLS | plaintext | mTLS / plaintext | goal |", "| --- | --- | --- | --- | --- |"]
    for label, key, fmt, goal in rows:
        if key not in secure:  # --kv-only
            continue
        scale = 1000 if key == "ttft_s" else 1
        lines.append(f"| {label} | {fmt.format(secure[key] * scale)} | {fmt.format(plain[key] * scale)} | "
                     f"{secure[key] / plain[key]:.3f} | {goal} |")
    lines += ["", "| KV stream CPU, s per GB moved | mTLS | plaintext | mTLS − plaintext |",
              "| --- | --- | --- | --- |"]
    cpu_secure, cpu_plain = secure["kv_cpu_s_per_gb"], plain["kv_cpu_s_per_gb"]
    for key in sorted(cpu_secure):
        end, kind = key.split()
        lines.append(f"| {end}, {'gRPC' if kind == 'grpc' else 'Python'} threads | {cpu_secure[key]:.3f} | "
                     f"{cpu_plain[key]:.3f} | {cpu_secure[key] - cpu_plain[key]:+.3f} |")
    both_secure, both_plain = sum(cpu_secure.values()), sum(cpu_plain.values())
    lines.append(f"| both ends | {both_secure:.3f} | {both_plain:.3f} | {both_secure - both_plain:+.3f} "
                 f"(plaintext / mTLS {both_plain / both_secure:.3f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each prefill node")
    parser.add_argument("--node-args", default="", help="more flags for every prefill and decode node")
    parser.add_argument("--decode-blocks", type=int, default=1024, help="KV blocks of each decode node")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side and measure (after a warm-up)")
    parser.add_argument("--kv-tokens", type=int, default=4096, help="(a) the streamed prompt's tokens")
    parser.add_argument("--ttft-tokens", type=int, default=512, help="(b) the prompt's tokens")
    parser.add_argument("--concurrency", type=int, default=16, help="(c) calls at once")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="(c) each call's prompt tokens")
    parser.add_argument("--output-tokens", type=int, default=64, help="(c) each call's output tokens")
    parser.add_argument("--kv-only", action="store_true", help="measure (a) only")
    parser.add_argument("--pin-ends", action="store_true",
                        help="(a) with this process and the cluster on separate halves of the CPUs")
    parser.add_argument("--json", default="out/bench-mtls.json")
    args = parser.parse_args(argv)
    layout = kv_layout_of(args.dtype)
    results = measure(args, layout)
    print(table(results, args, layout))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as out:
        json.dump({"args": vars(args), **results}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

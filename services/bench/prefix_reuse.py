"""``make bench-prefix``: TTFT of a prompt whose 800-token prefix another prefill node computed.

A cluster of processes on loopback (bundled model, bf16): gateway, two prefill nodes sharing a
cache-store (``--cache-store``: prompt blocks missing locally are fetched, computed ones written back),
one decode node. Per repeat, a fresh random 800-token prefix and three prompts ``prefix + suffix``:

1. **cold** — the first prefill node computes everything (and writes the blocks back);
2. **store hit** — the router's rotation sends it to the *other* prefill node, which fetches the prefix
   from the cache-store instead of computing it;
3. **local hit** — back on the first node, whose own prefix cache has it (the reference).

The decode node received the prefix with the cold request, so for 2 and 3 only the suffix's blocks move
P→D in every case. The prefill node of each response is checked, so a routing change cannot pass as a
hit. Medians of ``--repeats`` are printed as a Markdown table and written to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import grpc
import torch
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster


def _tokens(seed: int, length: int) -> list[int]:
    return torch.randint(100, 49000, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _ttft(stub: gateway_pb2_grpc.GatewayStub, token_ids: list[int]) -> tuple[float, str, int]:
    """(seconds to the first response, the prefill node, cached_tokens)."""
    request = gateway_pb2.GenerateRequest(token_ids=token_ids,
                                          sampling=gateway_pb2.SamplingParams(max_tokens=2, temperature=0))
    started = time.perf_counter()
    stream = stub.Generate(request, timeout=60)
    first = next(stream)
    elapsed = time.perf_counter() - started
    *_, last = [first, *stream]
    return elapsed, first.prefill_node, last.usage.cached_tokens


def run(args: argparse.Namespace) -> dict[str, object]:
    engine = ("--dtype", args.dtype, "--max-num-batched-tokens", "512")
    spec = ClusterSpec(num_prefill=2, engine_args=engine, prefill_args=("--threads", str(args.threads)),
                       decode_args=("--threads", "1"), prefill_cache_store=True,
                       gateway_args=("--routing", "load"))  # the rotation below: cache-aware would stay on one node
    rows: dict[str, list[float]] = {"cold": [], "store_hit": [], "local_hit": []}
    cached: dict[str, list[int]] = {name: [] for name in rows}
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster, grpc.insecure_channel(cluster.address) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        for r in range(args.warmup + args.repeats):
            prefix = _tokens(1000 + r, args.prefix_tokens)
            results = {}
            for i, name in enumerate(rows):
                time.sleep(args.pause_s)  # the previous request's decode and write-back finish first
                results[name] = _ttft(stub, prefix + _tokens(5000 + 10 * r + i, args.suffix_tokens))
            cold_node, store_node, local_node = (results[name][1] for name in rows)
            if store_node == cold_node or local_node != cold_node:
                raise RuntimeError(f"routing did not alternate: {cold_node}, {store_node}, {local_node}")
            if r >= args.warmup:
                for name, (seconds, _, cached_tokens) in results.items():
                    rows[name].append(seconds)
                    cached[name].append(cached_tokens)
    medians = {name: statistics.median(values) for name, values in rows.items()}
    return {"ttft_s": medians, "runs_s": rows, "cached_tokens": cached}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each prefill node")
    parser.add_argument("--prefix-tokens", type=int, default=800)
    parser.add_argument("--suffix-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--pause-s", type=float, default=0.5)
    parser.add_argument("--json", default="out/bench-prefix.json")
    args = parser.parse_args(argv)
    result = run(args)
    ttft, cached = result["ttft_s"], result["cached_tokens"]
    print(f"dtype={args.dtype}, prefill threads={args.threads}, prompt = {args.prefix_tokens}-token prefix + "
          f"{args.suffix_tokens}-token suffix, medians of {args.repeats} runs\n")
    print("| prompt | TTFT (ms) | cached_tokens | vs cold |\n| --- | --- | --- | --- |")
    labels = {"cold": "cold (computed on prefill node 1)", "store_hit": "prefix from the cache-store (prefill node 2)",
              "local_hit": "prefix in node 1's own cache"}
    for name, label in labels.items():
        print(f"| {label} | {ttft[name] * 1000:.0f} | {statistics.median(cached[name]):.0f} | "
              f"{ttft['cold'] / ttft[name]:.1f}× |")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"args": vars(args), **result}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``make bench-migration``: what it costs to move a draining decode node's running requests (issue 27).

Per round, a fresh cluster of processes on loopback (bundled model, bf16): cache-store, one prefill node,
decode nodes A and B (both offload to the cache-store), gateway. ``--streams`` greedy calls of
``--prompt-tokens`` random tokens and ``--output-tokens`` new tokens; once every call has its first token,
the decode node that holds most of them is drained (``Admin/Drain``, the launcher's admin certificate)
with a drain timeout far shorter than what the streams have left. It hands each running request to the
other node (KV through the cache-store, ``Adopt``); every call must still complete.

Per migrated request, from the drained node's ``drain: migrated`` log line: seconds from being marked to
the peer's grant, KV bytes moved, and the whole drain's seconds (``drain: migration done``). Medians over
``--rounds``; a Markdown table is printed and the numbers written to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from pdserve.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2, gateway_pb2_grpc

from services.bench.pd import _prompt
from services.bench.report import write_json
from services.cluster.local import ClusterSpec, start_cluster
from services.common.tls.channels import open_sync_channel


def _stream(stub: gateway_pb2_grpc.GatewayStub, ids: list[int], tokens: int, firsts: list[str]) -> int:
    sampling = gateway_pb2.SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    count = 0
    for response in stub.Generate(gateway_pb2.GenerateRequest(token_ids=ids, sampling=sampling), timeout=600):
        if not count:
            firsts.append(response.decode_node)
        count += len(response.token_ids)
    return count


def _log_events(path: Path, event: str) -> list[dict]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        if event in line and line.lstrip().startswith("{"):
            record = json.loads(line)
            if record.get("event") == event:
                events.append(record)
    return events


def one_round(seed: int, args: argparse.Namespace) -> dict[str, list[float] | float]:
    spec = ClusterSpec(num_decode=2, offload_to_cache_store=True,
                       engine_args=("--dtype", "bfloat16", "--num-kv-blocks", str(args.decode_blocks)),
                       decode_args=("--drain-timeout-s", "20"))
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-migration-") as scratch:
        logs = Path(scratch) / "cluster.log"
        with logs.open("wb") as stderr, start_cluster(spec, stderr=stderr.fileno()) as cluster, \
                grpc.insecure_channel(cluster.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            firsts: list[str] = []
            prompts = [_prompt(seed * 100 + i, args.prompt_tokens) for i in range(args.streams)]
            with ThreadPoolExecutor(args.streams) as pool:
                calls = [pool.submit(_stream, stub, ids, args.output_tokens, firsts) for ids in prompts]
                while len(firsts) < args.streams:
                    time.sleep(0.02)
                busiest = Counter(firsts).most_common(1)[0][0]
                with open_sync_channel(busiest, "decode", identity=cluster.identity) as admin:
                    admin_pb2_grpc.AdminStub(admin).Drain(admin_pb2.DrainRequest(reason="bench"), timeout=10)
                counts = [call.result() for call in calls]
            if counts != [args.output_tokens] * args.streams:
                raise RuntimeError(f"a stream was cut: {counts}")
        migrated = _log_events(logs, "drain: migrated")
        done = _log_events(logs, "drain: migration done")
    drained = max(done, key=lambda d: d["moved"], default=None)  # the others: nodes stopped at teardown
    if not migrated or drained is None:
        raise RuntimeError("the drained node logged no migration (is its log JSON?)")
    return {"seconds": [m["seconds"] for m in migrated], "bytes": [m["bytes"] for m in migrated],
            "blocks": [m["blocks"] for m in migrated], "drain_seconds": drained["seconds"],
            "moved": drained["moved"], "kept": drained["kept"]}


def summarise(rounds: list[dict]) -> dict[str, float]:
    seconds = [s for r in rounds for s in r["seconds"]]
    sizes = [b for r in rounds for b in r["bytes"]]
    return {"migrations": len(seconds), "seconds_per_request_p50": statistics.median(seconds),
            "seconds_per_request_max": max(seconds), "mib_per_request_p50": statistics.median(sizes) / 2**20,
            "drain_seconds_p50": statistics.median(r["drain_seconds"] for r in rounds),
            "kept_total": sum(r["kept"] for r in rounds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=8, help="calls in flight when the node drains")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt tokens per call")
    parser.add_argument("--output-tokens", type=int, default=256, help="new tokens per call")
    parser.add_argument("--decode-blocks", type=int, default=512, help="KV blocks of each decode node")
    parser.add_argument("--rounds", type=int, default=3, help="fresh clusters")
    parser.add_argument("--json", default="out/bench-migration.json")
    args = parser.parse_args(argv)
    rounds = [one_round(r + 1, args) for r in range(args.rounds)]
    result = summarise(rounds)
    print(f"{args.streams} streams of {args.prompt_tokens} + {args.output_tokens} tokens, {args.rounds} rounds\n\n"
          "| migrations | seconds per request p50 (max) | MiB per request p50 | whole drain p50 (s) | kept |\n"
          "|---|---|---|---|---|\n"
          f"| {result['migrations']} | {result['seconds_per_request_p50']:.3f} "
          f"({result['seconds_per_request_max']:.3f}) | {result['mib_per_request_p50']:.1f} | "
          f"{result['drain_seconds_p50']:.2f} | {result['kept_total']} |")
    write_json(args.json, {"args": vars(args), "summary": result, "rounds": rounds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

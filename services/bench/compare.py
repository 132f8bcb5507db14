"""``make bench-compare``: pdserve beside llama.cpp's server (llama-cpp-python[server]) on the same GGUF file,
the same workloads, alternately in one run.

Starts llama-cpp-python's server (from ``.venv-llamacpp``, ``make llamacpp``; ``--llamacpp-threads`` threads)
and a pdserve cluster on loopback (gateway with its OpenAI HTTP front, one prefill node, one decode node, the
cache-store; bf16, ``--pdserve-threads`` torch threads per model node), then runs three workloads of
``python -m services.bench`` against every target, ``--rounds`` rounds each, targets in turn, so only one
system is loaded at a time and all share the machine's conditions:

- ``c1``: random prompts (input ~256, output ~128 tokens), one request at a time;
- ``c16``: the same lengths, 16 requests in flight;
- ``prefix-c16``: shared-prefix (4 system prompts of 1024 tokens, 64-token questions, 128 output tokens),
  16 in flight.

Targets: pdserve's gRPC gateway, pdserve's OpenAI HTTP front, llama-cpp-python's server and, when
``make llama-server`` built it, llama.cpp's native ``llama-server`` with 16 parallel slots (the OpenAI ones
on ``/v1/completions``). Every generation is greedy with EOS ignored, so each request yields exactly its
output length everywhere. Prints a Markdown table per workload and a summary; writes
``--out-dir``/bench-compare.json and one PNG per workload.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.bench.__main__ import config_from_args, load_tokenizer, parser
from services.bench.llamacpp import DEFAULT_LLAMA_SERVER, DEFAULT_VENV, start_llama_server, start_llamacpp
from services.bench.plots import plot_runs
from services.bench.report import format_table, report_dict, summary
from services.bench.runner import run_benchmark
from services.cluster.local import ClusterSpec, start_cluster
from services.engine.model_files import bundled_model_path
from services.gateway.config import GatewayConfig


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    args: tuple[str, ...]


WORKLOADS = (
    Workload("c1", "concurrency 1, random input ~256 / output ~128",
             ("--dataset-name", "random", "--input-len", "256", "--output-len", "128", "--range-ratio", "0.25",
              "--num-prompts", "8", "--max-concurrency", "1")),
    Workload("c16", "concurrency 16, random input ~256 / output ~128",
             ("--dataset-name", "random", "--input-len", "256", "--output-len", "128", "--range-ratio", "0.25",
              "--num-prompts", "48", "--max-concurrency", "16")),
    Workload("prefix-c16", "concurrency 16, shared prefix: 4 groups × 1024-token system prompt + 64-token question, "
             "128 output", ("--dataset-name", "shared-prefix", "--num-groups", "4", "--prefix-len", "1024",
                            "--suffix-len", "64", "--output-len", "128", "--num-prompts", "32",
                            "--max-concurrency", "16")),
)


@contextlib.contextmanager
def pdserve_cluster(threads: int) -> Iterator[tuple[str, str]]:
    """(gRPC address, HTTP URL or "" when this gateway has no HTTP front)."""
    has_http = "http_listen" in {f.name for f in fields(GatewayConfig)}
    spec = ClusterSpec(engine_args=("--dtype", "bfloat16", "--threads", str(threads)), prefill_cache_store=True,
                       gateway_args=("--http-listen", "127.0.0.1:0") if has_http else ())
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster:
        with grpc.insecure_channel(cluster.address) as channel:
            status = gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(),
                                                                         timeout=10)
        yield cluster.address, getattr(status, "http_url", "")


def summary_table(workloads: dict[str, dict]) -> str:
    """Markdown: per workload and target, output tokens/s and the median and p99 latencies."""
    lines = ["| workload | target | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | E2E p50 (ms) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, workload in workloads.items():
        for target, result in workload["targets"].items():
            m = result["median"]
            lines.append(f"| {name} | {target} | {m['output_throughput']:.1f} | {m['ttft_ms']['median']:.0f} | "
                         f"{m['ttft_ms']['p99']:.0f} | {m['tpot_ms']['median']:.1f} | {m['e2el_ms']['median']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workloads", nargs="+", default=[w.name for w in WORKLOADS],
                   choices=[w.name for w in WORKLOADS])
    p.add_argument("--pdserve-threads", type=int, default=1, help="torch threads per pdserve model node")
    p.add_argument("--llamacpp-threads", type=int, default=2)
    p.add_argument("--llamacpp-venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER,
                   help="llama.cpp's native server binary, a fourth target when it exists (make llama-server)")
    p.add_argument("--no-llama-server", dest="native", action="store_false")
    p.add_argument("--no-grpc", dest="grpc", action="store_false", help="leave out pdserve's gRPC target")
    p.add_argument("--out-dir", type=Path, default=Path("out"))
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    model = bundled_model_path()
    tokenizer = load_tokenizer(None)
    report: dict[str, object] = {"rounds": args.rounds, "pdserve_threads": args.pdserve_threads,
                                 "llamacpp_threads": args.llamacpp_threads, "workloads": {}}
    native = args.native and args.llama_server.is_file()
    print("starting llama.cpp's server(s) and a pdserve cluster...", flush=True)
    with contextlib.ExitStack() as stack:
        llama = stack.enter_context(start_llamacpp(model, threads=args.llamacpp_threads, venv=args.llamacpp_venv))
        targets = [f"llama-cpp-python={llama.url}"]
        if native:
            server = stack.enter_context(start_llama_server(model, threads=args.llamacpp_threads,
                                                            binary=args.llama_server))
            targets.append(f"llama-server={server.url}")
        grpc_address, http_url = stack.enter_context(pdserve_cluster(args.pdserve_threads))
        if http_url:
            targets.insert(0, f"pdserve-http={http_url}")
        if args.grpc or not http_url:
            targets.insert(0, f"pdserve-grpc=grpc://{grpc_address}")
        for workload in (w for w in WORKLOADS if w.name in args.workloads):
            bench_args = [arg for t in targets for arg in ("--target", t)]
            bench_args += [*workload.args, "--alternate", str(args.rounds), "--warmup", "4"]
            if not args.progress:
                bench_args.append("--no-progress")
            config = config_from_args(parser().parse_args(bench_args))
            print(f"\n## {workload.name}: {workload.title}\n", flush=True)
            runs = asyncio.run(run_benchmark(config, tokenizer))
            medians = summary(runs)
            print(format_table(medians, args.rounds), flush=True)
            plot_runs(runs, args.out_dir / f"bench-compare-{workload.name}.png", title=workload.title)
            command = "python -m services.bench " + " ".join(bench_args)
            report["workloads"][workload.name] = {"title": workload.title, **report_dict(config, runs, command)}
    print("\n" + summary_table(report["workloads"]))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "bench-compare.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out_dir / 'bench-compare.json'} and bench-compare-*.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

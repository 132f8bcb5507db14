"""``make bench-observability``: what logs, metrics and tracing cost in tokens/s, on loopback with the real model.

Three configurations of the same cluster (gateway, one prefill node, one decode node, bf16, one torch
thread each), started in turn and measured alternately over ``--rounds`` rounds:

- ``baseline``: the code at ``--baseline-ref`` (before observability landed), run from a git worktree;
- ``off``: this checkout, tracing off (no ``OTEL_*`` set), every ``/metrics`` scraped once a second;
- ``on``: this checkout, tracing to OTLP (a sink collector in this process counts the spans), scraped too.

Each round sends ``--batches`` batches of ``--concurrency`` requests (``--prompt-tokens`` random tokens,
``--output-tokens`` greedy with ``ignore_eos``) and takes output tokens/s over the whole batch. Medians over
every batch of every round are printed as a Markdown table and written to ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import grpc.aio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.common.launch import REPO_ROOT

CONFIGS = ("baseline", "off", "on")


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP collector that only counts what it is sent."""

    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()

    def Export(self, request, context):
        count = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self._lock:
            self.spans += count
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def span_sink() -> Iterator[tuple[str, SpanSink]]:
    sink = SpanSink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", sink
    finally:
        server.stop(None)


@contextlib.contextmanager
def baseline_checkout(ref: str) -> Iterator[Path]:
    """A detached worktree of ``ref`` with its generated protos (the installed ones are this checkout's)."""
    with tempfile.TemporaryDirectory(prefix="pdserve-baseline-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), ref], cwd=REPO_ROOT, check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT, check=False)


class Scraper:
    """Reads every node's ``/metrics`` once a second while the load runs (what Prometheus would do)."""

    def __init__(self, urls: list[str], period_s: float = 1.0) -> None:
        self.urls, self.period_s, self.scrapes = urls, period_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        if self.urls:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for url in self.urls:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    reply.read()
                self.scrapes += 1


async def one_batch(address: str, args: argparse.Namespace, seed: int) -> float:
    """Output tokens/s of ``concurrency`` requests sent together."""
    rng = random.Random(seed)
    sampling = gateway_pb2.SamplingParams(max_tokens=args.output_tokens, temperature=0, ignore_eos=True)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def request() -> int:
            prompt = [rng.randrange(100, 49000) for _ in range(args.prompt_tokens)]
            tokens = 0
            async for response in stub.Generate(gateway_pb2.GenerateRequest(token_ids=prompt, sampling=sampling),
                                                timeout=300):
                tokens += len(response.token_ids)
            return tokens

        started = time.perf_counter()
        counts = await asyncio.gather(*(request() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - started
    assert all(c == args.output_tokens for c in counts), counts
    return sum(counts) / elapsed


def metrics_urls(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        status = gateway_pb2_grpc.GatewayStub(channel).ClusterStatus(gateway_pb2.ClusterStatusRequest(), timeout=10)
    return [u for u in (status.gateway_metrics_url, *(n.metrics_url for n in status.nodes)) if u]


def run_config(config: str, args: argparse.Namespace, baseline: Path, otlp: str,
               round_: int) -> tuple[list[float], int]:
    env = {}
    if config == "on":
        env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
               "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    # plaintext inside (insecure) in every configuration: the baseline predates internal mTLS, and what is
    # compared is the cost of logs, metrics and traces (``make bench-mtls`` measures mTLS's)
    spec = ClusterSpec(cache_store=False, engine_args=("--dtype", "bfloat16", "--threads", "1"),
                       env=env, cwd=baseline if config == "baseline" else None, insecure=True)
    with start_cluster(spec, stderr=subprocess.DEVNULL) as cluster:
        urls = metrics_urls(cluster.address)
        asyncio.run(one_batch(cluster.address, args, seed=1))  # warm-up: oneDNN kernels for the new shapes
        with Scraper(urls) as scraper:
            rates = [asyncio.run(one_batch(cluster.address, args, seed=100 * round_ + b))
                     for b in range(args.batches)]
        return rates, scraper.scrapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-ref", default="e115569", help="the commit before observability landed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=3, help="measured batches per round and configuration")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--json", default="out/bench-observability.json")
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {c: [] for c in CONFIGS}
    scrapes = dict.fromkeys(CONFIGS, 0)
    with baseline_checkout(args.baseline_ref) as baseline, span_sink() as (otlp, sink):
        for round_ in range(args.rounds):
            order = CONFIGS[round_ % 3:] + CONFIGS[:round_ % 3]  # rotate, so no configuration is always first
            for config in order:
                got, scraped = run_config(config, args, baseline, otlp, round_)
                rates[config] += got
                scrapes[config] += scraped
                print(f"round {round_ + 1} {config:8s} " + " ".join(f"{r:6.1f}" for r in got) + " tokens/s",
                      flush=True)
    medians = {c: statistics.median(r) for c, r in rates.items()}
    print(f"\n{args.concurrency} concurrent requests, {args.prompt_tokens} prompt + {args.output_tokens} output "
          f"tokens, medians of {args.rounds} rounds × {args.batches} batches\n")
    print("| configuration | output tokens/s | vs baseline |\n| --- | --- | --- |")
    for config in CONFIGS:
        change = (medians[config] / medians["baseline"] - 1) * 100
        print(f"| {config} | {medians[config]:.1f} | {change:+.1f}% |")
    print(f"\nspans received by the sink: {sink.spans}; scrapes: off {scrapes['off']}, on {scrapes['on']}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"args": vars(args), "rates": rates, "medians": medians, "spans": sink.spans,
                   "scrapes": scrapes}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

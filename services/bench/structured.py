"""``make bench-structured``: what a JSON schema costs in output throughput and compile time (issue 26).

(a) Output tokens/s at concurrency ``--concurrency`` (16) on one cluster of the bundled model (gateway,
    prefill node, decode node): that many ``Generate`` calls at once, each a fresh ``--prompt-tokens``
    random prompt and ``--output-tokens`` new tokens, greedy; total output tokens over the wall time of the
    batch. The same batch runs constrained by ``SCHEMA`` (``SamplingParams.structured.json_schema``: an
    array of at least ``MIN_ITEMS`` small objects, so no output completes before ``--output-tokens``) and
    unconstrained (``ignore_eos``, so each output has the same length; a constrained output that does not
    start as the schema says stops the benchmark), alternating run by run (the order
    flips each round, after a warm-up round of each), so what drifts on the machine lands on both. Medians
    of ``--repeats`` runs; the goal: constrained ≥ 85% of unconstrained.
(b) Schema compile time in this process, with the engine's ``StructuredCompiler`` over the bundled
    tokenizer (what every node and the gateway run): cold (``--compiles`` distinct schemas, each compiled
    once: llguidance's grammar and its first token mask) and cached (the same spec again: a lookup by its
    key). The compiler's one-off tokenizer setup is timed apart.

A Markdown table is printed and the numbers written to ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable

import grpc.aio
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.bench.pd import _prompt
from services.cluster.local import ClusterSpec, LocalCluster, start_cluster

SIDES = ("json_schema", "unconstrained")
MIN_ITEMS = 64
SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "minItems": MIN_ITEMS, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                                         "name": {"type": "string", "maxLength": 12},
                                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                  "maxItems": 3},
                                         "ok": {"type": "boolean"}},
        "required": ["id", "name", "tags", "ok"]}}},
    "required": ["items"]}


def _spec(args: argparse.Namespace) -> ClusterSpec:
    return ClusterSpec(cache_store=False, engine_args=("--dtype", args.dtype, *shlex.split(args.node_args)),
                       prefill_args=("--threads", str(args.threads)),
                       decode_args=("--threads", "1", "--num-kv-blocks", str(args.decode_blocks)))


def sampling_of(side: str, output_tokens: int) -> gateway_pb2.SamplingParams:
    if side == "unconstrained":
        return gateway_pb2.SamplingParams(max_tokens=output_tokens, temperature=0, ignore_eos=True)
    structured = gateway_pb2.StructuredOutput(json_schema=json.dumps(SCHEMA))
    return gateway_pb2.SamplingParams(max_tokens=output_tokens, temperature=0, structured=structured)


async def _batch(address: str, side: str, seed: int, args: argparse.Namespace) -> tuple[float, list[int]]:
    sampling = sampling_of(side, args.output_tokens)
    async with grpc.aio.insecure_channel(address) as channel:  # the gateway's public port
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(i: int) -> int:
            request = gateway_pb2.GenerateRequest(token_ids=_prompt(seed * 1000 + i, args.prompt_tokens),
                                                  sampling=sampling)
            replies = [r async for r in stub.Generate(request, timeout=600)]
            text = "".join(r.text for r in replies)
            if side == "json_schema" and not text.startswith('{"items": [{"id": '):
                raise RuntimeError(f"a constrained output does not follow the schema: {text[:80]!r}")
            return sum(len(r.token_ids) for r in replies)

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(args.concurrency)))
        return sum(counts) / (time.perf_counter() - started), counts


def throughput(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, dict]:
    """(a): per side, the median output tokens/s, every run's, and the mean output length."""
    runs: dict[str, list[float]] = {side: [] for side in SIDES}
    lengths: dict[str, list[int]] = {side: [] for side in SIDES}
    for round_ in range(args.repeats + 1):  # round 0: warm-up (compiles, first batches), not counted
        for index, side in enumerate(SIDES if round_ % 2 == 0 else SIDES[::-1]):
            time.sleep(0.3)
            rate, counts = asyncio.run(_batch(cluster.address, side, 1000 * (round_ + 1) + 100 * index, args))
            if round_:
                runs[side].append(rate)
                lengths[side] += counts
    return {side: {"output_tokens_per_s": statistics.median(runs[side]), "runs": runs[side],
                   "mean_output_tokens": statistics.fmean(lengths[side])} for side in SIDES}


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def compile_times(compiles: int) -> dict[str, float]:
    """(b): seconds: the compiler's tokenizer setup, then the median cold and cached compile of a schema."""
    from services.engine.model_files import bundled_model_path
    from services.engine.structured.compiler import StructuredCompiler
    from services.engine.structured_spec import StructuredSpec
    from services.engine.tokenizer import Tokenizer
    from services.engine.weights import load_model_config

    path = bundled_model_path()
    model = load_model_config(path)
    compiler = StructuredCompiler(Tokenizer.load(path, model.eos_token_ids), model.vocab_size)
    setup = _timed(lambda: compiler.ll_tokenizer)
    specs = [StructuredSpec("json_schema", json.dumps({**SCHEMA, "title": f"schema {i}"})) for i in range(compiles)]
    cold = [_timed(lambda spec=spec: compiler.compile(spec)) for spec in specs]
    cached = [_timed(lambda spec=spec: compiler.compile(spec)) for spec in specs]
    return {"tokenizer_setup_s": setup, "cold_s": statistics.median(cold), "cold_max_s": max(cold),
            "cached_s": statistics.median(cached)}


def table(results: dict, args: argparse.Namespace) -> str:
    schema, free = results["throughput"]["json_schema"], results["throughput"]["unconstrained"]
    ratio = schema["output_tokens_per_s"] / free["output_tokens_per_s"]
    compiled = results["compile"]
    return "\n".join([
        f"dtype={args.dtype}, prefill threads={args.threads}, concurrency {args.concurrency}, "
        f"{args.prompt_tokens}-token prompts, {args.output_tokens} output tokens, medians of {args.repeats} "
        "alternating runs\n",
        "| measure | JSON schema | unconstrained | schema / unconstrained | goal |",
        "| --- | --- | --- | --- | --- |",
        f"| output tokens/s, concurrency {args.concurrency} | {schema['output_tokens_per_s']:.1f} | "
        f"{free['output_tokens_per_s']:.1f} | {ratio:.3f} | ≥ 0.85 |",
        f"| mean output tokens per request | {schema['mean_output_tokens']:.1f} | "
        f"{free['mean_output_tokens']:.1f} | | |",
        "",
        f"| schema compile ({args.compiles} schemas) | ms |", "| --- | --- |",
        f"| cold, median | {compiled['cold_s'] * 1e3:.2f} |",
        f"| cold, worst | {compiled['cold_max_s'] * 1e3:.2f} |",
        f"| cached, median | {compiled['cached_s'] * 1e3:.4f} |",
        f"| compiler's tokenizer setup (once per process) | {compiled['tokenizer_setup_s'] * 1e3:.0f} |"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the prefill node")
    parser.add_argument("--node-args", default="", help="more flags for the prefill and decode nodes")
    parser.add_argument("--decode-blocks", type=int, default=1024, help="KV blocks of the decode node")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side (after a warm-up round)")
    parser.add_argument("--concurrency", type=int, default=16, help="(a) calls at once")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="(a) each call's prompt tokens")
    parser.add_argument("--output-tokens", type=int, default=128, help="(a) each call's output tokens")
    parser.add_argument("--compiles", type=int, default=50, help="(b) distinct schemas compiled")
    parser.add_argument("--json", default="out/bench-structured.json")
    args = parser.parse_args(argv)
    results = {"compile": compile_times(args.compiles)}
    with start_cluster(_spec(args), stderr=subprocess.DEVNULL) as cluster:
        results["throughput"] = throughput(cluster, args)
    print(table(results, args))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as out:
        json.dump({"args": vars(args), "schema": SCHEMA, **results}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

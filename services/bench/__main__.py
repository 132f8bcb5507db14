"""``python -m services.bench`` (``make bench-serve``): load-test pdserve's gRPC gateway or any
OpenAI-compatible server, in the style of ``vllm bench serve``.

    python -m services.bench --target grpc://127.0.0.1:50051 --dataset-name random --input-len 256 \\
        --output-len 128 --num-prompts 64 --max-concurrency 16 --json out/bench.json --plot out/bench.png
    python -m services.bench --target pdserve=grpc://127.0.0.1:50051 --target llama=http://127.0.0.1:8080 \\
        --alternate 3 --dataset-name shared-prefix --num-groups 4 --prefix-len 1024 --suffix-len 64

Several ``--target``s run the same workload in turn (``--alternate N`` rounds: A B A B ...); the table shows
each target's medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import sys
from pathlib import Path

from services.bench.datasets import DATASETS, DatasetSpec
from services.bench.load import LoadSpec
from services.bench.metrics import parse_slos
from services.bench.report import format_table, report_dict, summary, write_json
from services.bench.runner import BenchConfig, run_benchmark
from services.bench.targets import ENDPOINTS, SamplingSpec, TargetSpec


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written; each flag's default in its help, unless it has none or says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if (action.default in (None, [], argparse.SUPPRESS) or "default" in (action.help or "")
                or action.nargs == 0):  # a switch: its help says what it turns on or off
            return action.help
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    """The flags; vLLM's names (``vllm bench serve``) are aliases where they mean the same."""
    p = argparse.ArgumentParser(prog="python -m services.bench", description=__doc__, formatter_class=_Help)
    p.add_argument("--target", "--base-url", action="append", default=[], metavar="[NAME=]URL",
                   help="grpc://host:port (pdserve) or http://host:port (OpenAI API); repeat to compare "
                        "(default grpc://127.0.0.1:50051)")
    p.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS,
                   help="OpenAI route; chat sends messages (to pdserve's gRPC target as well)")
    p.add_argument("--model", default="", help="model name for OpenAI targets (default: the first listed)")
    p.add_argument("--tokenizer", type=Path, default=None, help="GGUF or tokenizer directory (default: bundled)")
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset-name", default="random", choices=DATASETS, help="the prompts")
    d.add_argument("--dataset-path", type=Path, help="ShareGPT-format JSON (sharegpt)")
    d.add_argument("--num-prompts", type=int, default=100, help="measured requests per target and round")
    d.add_argument("--input-len", "--random-input-len", type=int, default=256, help="mean prompt tokens (random)")
    d.add_argument("--output-len", "--random-output-len", type=int, default=128,
                   help="mean output tokens (random, shared-prefix)")
    d.add_argument("--range-ratio", "--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform on len × [1-r, 1+r] (random)")
    d.add_argument("--num-groups", type=int, default=4, help="distinct system prompts (shared-prefix)")
    d.add_argument("--prefix-len", type=int, default=1024, help="system prompt tokens (shared-prefix)")
    d.add_argument("--suffix-len", type=int, default=64, help="question tokens per request (shared-prefix)")
    d.add_argument("--sharegpt-output-len", type=int, help="fixed output tokens (sharegpt; default: the answer's)")
    d.add_argument("--seed", type=int, default=0, help="of the dataset and the arrivals")
    g = p.add_argument_group("load")
    g.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (inf = all)")
    g.add_argument("--max-concurrency", type=int, help="requests in flight at most")
    g.add_argument("--warmup", type=int, default=2, help="unmeasured requests per target first")
    g.add_argument("--alternate", type=int, default=1, metavar="ROUNDS", help="rounds, targets in turn")
    g.add_argument("--temperature", type=float, default=0.0, help="of every request (0: greedy)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let generations stop at EOS (default: generate exactly the output length)")
    g.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    o = p.add_argument_group("output")
    o.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    o.add_argument("--json", "--result-filename", type=Path, help="write the results here")
    o.add_argument("--plot", type=Path, help="write a PNG of latency CDFs and throughput here")
    o.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    dataset = DatasetSpec(name=args.dataset_name, num_prompts=args.num_prompts, seed=args.seed,
                          input_len=args.input_len, output_len=args.output_len, range_ratio=args.range_ratio,
                          num_groups=args.num_groups, prefix_len=args.prefix_len, suffix_len=args.suffix_len,
                          path=args.dataset_path, sharegpt_output_len=args.sharegpt_output_len)
    load = LoadSpec(request_rate=args.request_rate, max_concurrency=args.max_concurrency, seed=args.seed,
                    progress=args.progress)
    sampling = SamplingSpec(temperature=args.temperature, ignore_eos=args.ignore_eos, endpoint=args.endpoint,
                            model=args.model, timeout_s=args.timeout_s)
    targets = tuple(TargetSpec.parse(t) for t in args.target or ["grpc://127.0.0.1:50051"])
    if len({t.name for t in targets}) != len(targets):
        raise ValueError("targets need distinct names (use NAME=URL)")
    return BenchConfig(targets=targets, dataset=dataset, load=load, sampling=sampling, warmup=args.warmup,
                       rounds=args.alternate, slos=parse_slos(args.goodput))


def workload_title(config: BenchConfig) -> str:
    """What ran, for the plot: the dataset and its lengths, the load, the sampling."""
    d, load = config.dataset, config.load
    lengths = {"random": f"input {d.input_len}, output {d.output_len} tokens (±{d.range_ratio:.0%})",
               "shared-prefix": f"{d.num_groups} prefixes of {d.prefix_len} + {d.suffix_len} tokens, output "
                                f"{d.output_len}",
               "sharegpt": f"ShareGPT, output {d.sharegpt_output_len or 'as answered'}"}.get(d.name, d.name)
    concurrency = f"concurrency {load.max_concurrency}" if load.max_concurrency else "no concurrency cap"
    rate = "all at once" if math.isinf(load.request_rate) else f"{load.request_rate:g} req/s"
    return (f"{d.name}: {d.num_prompts} prompts, {lengths}; {concurrency}, {rate}; temperature "
            f"{config.sampling.temperature:g}, {config.rounds} round(s)")


def load_tokenizer(path: Path | None):
    from services.engine.model_files import bundled_model_path
    from services.engine.tokenizer import Tokenizer

    return Tokenizer.load(path or bundled_model_path())


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        p.error(str(exc))
    runs = asyncio.run(run_benchmark(config, load_tokenizer(args.tokenizer)))
    medians = summary(runs)
    print(format_table(medians, config.rounds))
    failed = sum(r.metrics.failed for r in runs)
    if failed:
        errors = [o.error for r in runs for o in r.outcomes if not o.ok]
        print(f"\n{failed} requests failed; first error: {errors[0]}", file=sys.stderr)
    if args.json:
        command = shlex.join(["python -m services.bench", *(argv if argv is not None else sys.argv[1:])])
        write_json(args.json, report_dict(config, runs, command))
    if args.plot:
        from services.bench.plots import plot_runs

        plot_runs(runs, args.plot, title=workload_title(config), slos=config.slos)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

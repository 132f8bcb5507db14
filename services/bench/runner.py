"""One benchmark invocation: warm every target up, then run the workload ``rounds`` times on each target in
turn (A B A B ...), so targets compared in one invocation share the machine's conditions.

Round ``r`` uses dataset seed ``seed + r`` on every target, and target ``i`` salt ``i``: within a round all
targets get prompts of the same lengths (and shared-prefix groups of the same shape) made of different
words, and no round repeats an earlier round's prompts, so no target is served from a prefix cache that
an earlier run filled (pdserve's gRPC gateway and its HTTP front share one). ShareGPT prompts are the
file's: the same for every target. Warm-up requests come from another seed and are not measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from services.bench.datasets import BenchRequest, DatasetSpec, TextTokenizer, WordVocabulary, build_dataset
from services.bench.load import LoadSpec, run_load
from services.bench.metrics import BenchMetrics, compute_metrics
from services.bench.outcome import RequestOutcome
from services.bench.targets import SamplingSpec, Target, TargetSpec, open_target

WARMUP_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class BenchConfig:
    targets: tuple[TargetSpec, ...]
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    load: LoadSpec = field(default_factory=LoadSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    warmup: int = 2  # requests per target before the first round, not measured
    rounds: int = 1
    slos: Mapping[str, float] = field(default_factory=dict)


@dataclass
class TargetRun:
    target: str
    round: int
    metrics: BenchMetrics
    outcomes: list[RequestOutcome]


class WarmupFailed(RuntimeError):
    pass


async def run_benchmark(config: BenchConfig, tokenizer: TextTokenizer) -> list[TargetRun]:
    """Every (round, target) run, in the order they ran."""
    vocab = None if config.dataset.name == "sharegpt" else WordVocabulary(tokenizer)

    def workload(seed: int, count: int, salt: int = 0) -> list[BenchRequest]:
        return build_dataset(replace(config.dataset, seed=seed, num_prompts=count, salt=salt), tokenizer, vocab)

    targets: list[Target] = []
    try:
        for spec in config.targets:
            targets.append(await open_target(spec, config.sampling))
        if config.warmup:
            warmup = _warmup_requests(config, workload)
            for target in targets:
                await _warm_up(target, warmup, config.load)
        runs = []
        for round_ in range(config.rounds):
            for salt, target in enumerate(targets):
                requests = workload(config.dataset.seed + round_, config.dataset.num_prompts, salt)
                load = replace(config.load, seed=config.load.seed + round_)
                label = f"{target.spec.name} round {round_ + 1}/{config.rounds}"
                result = await run_load(requests, target.generate, load, description=label)
                metrics = compute_metrics(result.outcomes, result.duration_s, config.slos, result.peak_concurrency)
                runs.append(TargetRun(target.spec.name, round_, metrics, result.outcomes))
        return runs
    finally:
        for target in targets:
            await target.close()


def _warmup_requests(config: BenchConfig, workload) -> list[BenchRequest]:
    if config.dataset.name == "shared-prefix":  # whole groups only
        groups = config.dataset.num_groups
        count = max(groups, -(-config.warmup // groups) * groups)
        return workload(config.dataset.seed + WARMUP_SEED_OFFSET, count)[:config.warmup]
    if config.dataset.name == "sharegpt":
        return workload(config.dataset.seed, config.warmup)
    return workload(config.dataset.seed + WARMUP_SEED_OFFSET, config.warmup)


async def _warm_up(target: Target, requests: Sequence[BenchRequest], load: LoadSpec) -> None:
    result = await run_load(requests, target.generate, replace(load, request_rate=float("inf")),
                            description=f"{target.spec.name} warm-up")
    failed = [o.error for o in result.outcomes if not o.ok]
    if failed:
        raise WarmupFailed(f"{target.spec.name}: {len(failed)} of {len(requests)} warm-up requests failed, "
                           f"first: {failed[0]}")

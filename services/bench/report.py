"""A benchmark's results as a printed table (one column per target, medians over rounds) and as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from services.bench.metrics import median_metrics
from services.bench.runner import BenchConfig, TargetRun

ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, key path, format)
    ("Completed requests", "completed", "{:.0f}"),
    ("Failed requests", "failed", "{:.0f}"),
    ("Duration (s)", "duration_s", "{:.2f}"),
    ("Total input tokens", "total_input_tokens", "{:.0f}"),
    ("Total output tokens", "total_output_tokens", "{:.0f}"),
    ("Request throughput (req/s)", "request_throughput", "{:.3f}"),
    ("Goodput (req/s)", "goodput", "{:.3f}"),
    ("Input token throughput (tok/s)", "input_throughput", "{:.1f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.1f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    *((f"{name} {stat} (ms)", f"{key}.{stat}", "{:.1f}")
      for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E latency", "e2el_ms"))
      for stat in ("mean", "median", "p90", "p99", "std")),
    ("Peak concurrency", "peak_concurrency", "{:.0f}"),
)


def by_target(runs: Sequence[TargetRun]) -> dict[str, list[TargetRun]]:
    grouped: dict[str, list[TargetRun]] = {}
    for run in runs:
        grouped.setdefault(run.target, []).append(run)
    return grouped


def summary(runs: Sequence[TargetRun]) -> dict[str, dict]:
    """Per target: the median over its rounds of every metric."""
    return {name: median_metrics([r.metrics for r in target_runs]) for name, target_runs in by_target(runs).items()}


def _lookup(metrics: Mapping[str, Any], path: str) -> Any:
    value: Any = metrics
    for key in path.split("."):
        value = value[key]
    return value


def format_table(medians: Mapping[str, Mapping[str, Any]], rounds: int = 1) -> str:
    """Markdown table: one row per metric, one column per target."""
    names = list(medians)
    title = "metric" if rounds == 1 else f"metric (median of {rounds} rounds)"
    lines = [f"| {title} | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for label, path, fmt in ROWS:
        cells = [_lookup(medians[name], path) for name in names]
        if all(c is None for c in cells):
            continue
        lines.append(f"| {label} | " + " | ".join("-" if c is None else fmt.format(c) for c in cells) + " |")
    return "\n".join(lines)


def outcome_record(outcome) -> dict[str, Any]:
    tpot = outcome.tpot_s
    return {"ok": outcome.ok, "prompt_len": outcome.prompt_len, "output_tokens": outcome.output_tokens,
            "ttft_ms": outcome.ttft_s * 1000, "tpot_ms": None if tpot is None else tpot * 1000,
            "e2el_ms": outcome.latency_s * 1000, "error": outcome.error}


def report_dict(config: BenchConfig, runs: Sequence[TargetRun], command: str = "") -> dict[str, Any]:
    medians = summary(runs)
    return {
        "command": command,
        "config": {"targets": [asdict(t) for t in config.targets], "dataset": _jsonable(asdict(config.dataset)),
                   "load": _jsonable(asdict(config.load)), "sampling": asdict(config.sampling),
                   "warmup": config.warmup, "rounds": config.rounds, "slos": dict(config.slos)},
        "targets": {
            name: {"median": medians[name],
                   "rounds": [r.metrics.to_dict() for r in target_runs],
                   "requests": [[outcome_record(o) for o in r.outcomes] for r in target_runs]}
            for name, target_runs in by_target(runs).items()},
    }


def write_json(path: str | Path, report: Mapping[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """inf → "inf", paths → str (JSON has neither)."""
    out = {}
    for key, value in values.items():
        if (isinstance(value, float) and value in (float("inf"), float("-inf"))) or isinstance(value, Path):
            value = str(value)
        out[key] = value
    return out

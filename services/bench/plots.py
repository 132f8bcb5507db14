"""A PNG of a benchmark: latency CDFs (TTFT, TPOT, E2E) per target, with the goodput SLOs drawn as vertical
lines, and output-token throughput bars; titled with the workload."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np

from services.bench.report import by_target
from services.bench.runner import TargetRun

CDFS = (("ttft", "TTFT (ms)", lambda o: o.ttft_s * 1000),
        ("tpot", "TPOT (ms)", lambda o: None if o.tpot_s is None else o.tpot_s * 1000),
        ("e2el", "E2E latency (ms)", lambda o: o.latency_s * 1000))


def plot_runs(runs: Sequence[TargetRun], path: str | Path, title: str = "",
              slos: Mapping[str, float] | None = None) -> None:
    """CDFs pool every completed request of every round; bars are the median over rounds, whiskers the
    lowest and highest round. ``slos``: the goodput limits in ms by metric (``ttft``, ``tpot``, ``e2el``)."""
    grouped = by_target(runs)
    figure, axes = plt.subplots(1, 4, figsize=(18, 4.6))
    for ax, (metric, label, value) in zip(axes, CDFS, strict=False):
        for name, target_runs in grouped.items():
            values = [v for r in target_runs for o in r.outcomes if o.ok and (v := value(o)) is not None]
            if values:
                data = np.sort(values)
                ax.step(data, np.arange(1, len(data) + 1) / len(data), where="post", label=name)
        low, high = ax.dataLim.x0, ax.dataLim.x1
        if low > 0 and high / low > 50:  # a queue-bound target next to a batching one: log scale
            ax.set_xscale("log")
        if slos and metric in slos:
            ax.axvline(slos[metric], color="red", linestyle="--", linewidth=1, label=f"SLO {slos[metric]:g} ms")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    names = list(grouped)
    rates = [[r.metrics.output_throughput for r in grouped[n]] for n in names]
    medians = [float(np.median(r)) for r in rates]
    errors = np.array([[m - min(r) for m, r in zip(medians, rates, strict=True)],
                       [max(r) - m for m, r in zip(medians, rates, strict=True)]])
    bars = axes[3]
    bars.bar(names, medians, yerr=errors, capsize=6, color=[f"C{i}" for i in range(len(names))])
    bars.set_ylabel("output tokens/s")
    bars.grid(axis="y", alpha=0.3)
    bars.tick_params(axis="x", labelsize=8)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)

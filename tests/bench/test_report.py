"""The benchmark's report: JSON layout, the table's medians over rounds, the PNG, target parsing."""

from __future__ import annotations

import json

import pytest

from services.bench.__main__ import config_from_args, parser, workload_title
from services.bench.datasets import DatasetSpec
from services.bench.metrics import compute_metrics
from services.bench.outcome import RequestOutcome
from services.bench.report import format_table, report_dict, summary, write_json
from services.bench.runner import BenchConfig, TargetRun
from services.bench.targets import TargetSpec


def run(target: str, round_: int, ttft: float, duration: float) -> TargetRun:
    outcomes = [RequestOutcome(ok=True, prompt_len=100, output_tokens=11, ttft_s=ttft, latency_s=ttft + 1.0,
                               itl_s=[0.1] * 10),
                RequestOutcome(ok=False, prompt_len=100, error="UNAVAILABLE: gone")]
    return TargetRun(target, round_, compute_metrics(outcomes, duration, {"ttft": 250}), outcomes)


RUNS = [run("a", 0, 0.1, 2.0), run("b", 0, 0.4, 4.0), run("a", 1, 0.3, 1.0), run("b", 1, 0.2, 3.0),
        run("a", 2, 0.2, 3.0), run("b", 2, 0.6, 5.0)]
CONFIG = BenchConfig(targets=(TargetSpec("a", "grpc://127.0.0.1:1"), TargetSpec("b", "http://127.0.0.1:2")),
                     dataset=DatasetSpec(name="random", num_prompts=2), rounds=3, slos={"ttft": 250.0})


def test_report_json_has_medians_rounds_and_requests(tmp_path):
    path = tmp_path / "sub" / "out.json"
    write_json(path, report_dict(CONFIG, RUNS, command="python -m services.bench --alternate 3"))
    report = json.loads(path.read_text())
    assert report["command"] == "python -m services.bench --alternate 3"
    assert report["config"]["load"]["request_rate"] == "inf"
    assert report["config"]["rounds"] == 3 and report["config"]["slos"] == {"ttft": 250.0}
    assert list(report["targets"]) == ["a", "b"]
    a = report["targets"]["a"]
    assert [r["ttft_ms"]["mean"] for r in a["rounds"]] == pytest.approx([100.0, 300.0, 200.0])
    assert a["median"]["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert a["median"]["output_throughput"] == pytest.approx(11 / 2.0)
    assert a["median"]["completed"] == 1 and a["median"]["failed"] == 1
    assert a["median"]["goodput"] == pytest.approx(1 / 3.0)  # rounds: 1/2.0, 0 (TTFT 300 ms), 1/3.0
    first = a["requests"][0]
    assert first[0] == {"ok": True, "prompt_len": 100, "output_tokens": 11, "ttft_ms": pytest.approx(100.0),
                        "tpot_ms": pytest.approx(100.0), "e2el_ms": pytest.approx(1100.0), "error": ""}
    assert first[1]["ok"] is False and first[1]["error"] == "UNAVAILABLE: gone"


def test_table_has_one_column_per_target():
    table = format_table(summary(RUNS), rounds=3)
    lines = table.splitlines()
    assert lines[0] == "| metric (median of 3 rounds) | a | b |"
    assert "| Output token throughput (tok/s) | 5.5 | 2.8 |" in lines
    assert "| TTFT median (ms) | 200.0 | 400.0 |" in lines
    assert "| Goodput (req/s) | 0.333 | 0.000 |" in lines


def test_plot_writes_a_png_with_the_slo_lines_and_the_workload(tmp_path, monkeypatch):
    import matplotlib.figure

    from services.bench.plots import plot_runs

    drawn: list[matplotlib.figure.Figure] = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: (drawn.append(self),
                                                                                    save(self, *a, **k)))
    path = tmp_path / "bench.png"
    plot_runs(RUNS, path, title=workload_title(CONFIG), slos=CONFIG.slos)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (figure,) = drawn
    assert figure.get_suptitle().startswith("random: 2 prompts, input 256, output 128 tokens")
    ttft = figure.axes[0]
    assert [line.get_xdata()[0] for line in ttft.lines if line.get_linestyle() == "--"] == [250.0]
    assert "SLO 250 ms" in [t.get_text() for t in ttft.get_legend().get_texts()]


def test_vllm_flag_names_are_aliases():
    ours = config_from_args(parser().parse_args(["--target", "http://127.0.0.1:8000", "--input-len", "300",
                                                 "--output-len", "40", "--range-ratio", "0.1"]))
    vllm = config_from_args(parser().parse_args(["--base-url", "http://127.0.0.1:8000", "--random-input-len",
                                                 "300", "--random-output-len", "40", "--random-range-ratio",
                                                 "0.1"]))
    assert ours == vllm and ours.dataset.input_len == 300 and ours.targets[0].url == "http://127.0.0.1:8000"


def test_target_specs():
    assert TargetSpec.parse("grpc://127.0.0.1:50051") == TargetSpec("grpc://127.0.0.1:50051", "grpc://127.0.0.1:50051")
    spec = TargetSpec.parse("llama=http://127.0.0.1:8080")
    assert (spec.name, spec.scheme, spec.address) == ("llama", "http", "127.0.0.1:8080")
    for bad in ("127.0.0.1:1", "ftp://x:1", "grpc://"):
        with pytest.raises(ValueError):
            TargetSpec.parse(bad)


def test_a_target_may_ask_for_logprobs():
    assert TargetSpec.parse("lp=http://127.0.0.1:8000?logprobs=5") == TargetSpec("lp", "http://127.0.0.1:8000", 5)
    spec = TargetSpec.parse("grpc://127.0.0.1:1?logprobs=0")
    assert (spec.name, spec.address, spec.logprobs) == ("grpc://127.0.0.1:1?logprobs=0", "127.0.0.1:1", 0)
    for bad, message in (("http://x:1?top=3", "unknown option 'top'"), ("http://x:1?logprobs=21", r"\[0, 20\]"),
                         ("http://x:1?logprobs=-1", "got '-1'")):
        with pytest.raises(ValueError, match=message):
            TargetSpec.parse(bad)

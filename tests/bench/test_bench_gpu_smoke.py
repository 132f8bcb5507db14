"""``gpu.suite --smoke --device cpu``: the GPU benchmark's harness runs end to end on a CPU (tiny sizes, a
tiny random model, a real decode-node process for the transfer section), so that it works when a session
with a GPU comes. Only the harness is checked here: the figures of a CPU smoke run mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from services.bench.gpu.suite import SMOKE
from services.engine.random_llama import PRESETS


def test_every_section_runs_on_a_cpu_and_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "bench-gpu.json"
    done = subprocess.run([sys.executable, "-m", "services.bench.gpu.suite", "--device", "cpu", "--smoke",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["device"] == "cpu" and figures["smoke"] is True

    attention = figures["attention"]
    assert [row["case"] for row in attention] == ["decode 2 x 40", "prefill 48 after 16"]
    assert all(row["backend_ms"] > 0 and row["torch_ms"] > 0 for row in attention)

    transfer = figures["transfer"]["model"]  # a smoke run moves the tiny model's KV only
    tiny = PRESETS["tiny"]
    assert transfer["tokens"] == SMOKE["tokens"]
    assert transfer["bytes"] == SMOKE["tokens"] * tiny.kv_bytes_per_token(2)
    assert transfer["ipc_used"] is False  # a CPU pool is never exported; the fallback says why
    assert "only CUDA pools" in transfer["fallback"]
    assert transfer["grpc_ms"] > 0 and transfer["ipc_ms"] > 0

    rows = figures["decode"]["rows"]  # each batch eager, then through the graphs' CPU stand-in
    assert [(row["batch"], row["graphs"]) for row in rows] == [(b, g) for b in SMOKE["batches"] for g in (False, True)]
    assert all(row["model"] == "tiny (random weights)" and row["tokens_per_s"] > 0 for row in rows)
    assert "| tiny (random weights) | eager |" in done.stdout and "| tiny (random weights) | graphs |" in done.stdout
    # the engine's log lines go to stderr: stdout is the markdown report (they once broke the decode table)
    assert "cuda graphs: decode captured" in done.stderr and "decode captured" not in done.stdout

    prefill = figures["prefill"]
    assert prefill["peak_flops_per_s"] > 0
    [row] = prefill["rows"]
    assert row["tokens"] == SMOKE["prefill_tokens"] and row["ms"] > 0 and row["of_peak"] > 0

    from services.bench.gpu.sampling import MODES

    sampling = figures["sampling"]["rows"]  # every mode at every batch, on the device and on the host
    assert [(row["mode"], row["batch"]) for row in sampling] == [(m, b) for m in MODES for b in SMOKE["batches"]]
    assert all(row["device_ms"] > 0 and row["host_ms"] > 0 for row in sampling)

"""``make bench-hybrid-prefix``: its machinery runs end to end on the tiny Qwen3.5 shape (the figures of such a run
mean nothing), and the rows it reports are what it claims: the engine without checkpoints serves nothing from its
cache, the first prompt nothing, the third the system prompt's blocks, the next turn the third's prompt."""

from __future__ import annotations

import json
from pathlib import Path

from services.bench.hybrid_prefix import ROWS, main


def test_the_benchmark_runs_on_the_tiny_shape_and_its_rows_hit_as_named(tmp_path: Path, capsys) -> None:
    out = tmp_path / "hybrid-prefix.json"
    assert main(["--shape", "tiny-qwen3.5", "--system-tokens", "100", "--user-tokens", "20", "--chunk", "64",
                 "--repeats", "2", "--warmup", "0", "--kv-cache-gib", "0.05", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["result"]["runs"]
    assert all(len(runs[row]) == 2 and min(s for s, _ in runs[row]) > 0 for row in ROWS)
    cached = {row: {c for _, c in runs[row]} for row in ROWS}
    # the third prompt (120 tokens) hits the 96 the second saved; the next turn (120 + 1 + 20) the third's 112
    assert cached == {"off": {0}, "first": {0}, "hit": {96}, "next turn": {112}}
    assert capsys.readouterr().out.count("| hit |") == 1

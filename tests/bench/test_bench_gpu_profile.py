"""``gpu.profile_step`` runs on a CPU with a tiny model (so that it works when a GPU session comes)."""

from __future__ import annotations

from services.bench.gpu.profile_step import profile


def test_the_step_profile_runs_and_names_the_engine_step(capsys) -> None:
    ms = profile("tiny", batch=2, device="cpu", prompt_len=32, top=10)
    out = capsys.readouterr().out
    assert ms > 0
    assert "### tiny, batch 2, cpu:" in out and "engine.py" in out and "cumulative" in out

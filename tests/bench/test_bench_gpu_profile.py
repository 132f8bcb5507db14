"""``gpu.profile_step`` runs on a CPU with a tiny model (so that it works when a GPU session comes), eager and
through the decode graphs' CPU stand-in."""

from __future__ import annotations

import torch

from services.bench.gpu.profile_step import profile
from services.engine.random_llama import PRESETS, random_model


def test_the_step_profile_runs_in_both_modes_and_names_the_engine_step(capsys) -> None:
    model = random_model(PRESETS["tiny"], torch.bfloat16, "cpu", seed=1)
    for graphs in (False, True):
        summary = profile(model, batch=2, device="cpu", graphs=graphs, prompt_len=32, top=10)
        out = capsys.readouterr().out
        assert summary["host_ms"] > 0 and summary["graphs"] is graphs and summary["batch"] == 2
        assert summary["launches"] == 0 and summary["gpu_ms"] == 0  # no CUDA: no kernels to count
        mode = "graphs" if graphs else "eager"
        assert f"### batch 2, {mode}, cpu:" in out and "engine.py" in out and "cumulative" in out
    assert "decode_graphs.py" in out  # the graphs' run is what the profiled steps went through

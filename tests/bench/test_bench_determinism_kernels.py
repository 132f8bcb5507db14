"""``services.bench.determinism_kernels`` runs end to end at a tiny size and reports every kernel it compares."""

from __future__ import annotations

from kernels.amx_linear import amx_supported
from kernels.int4_fixed import int4_fixed_supported
from services.bench import determinism_kernels


def test_prints_attention_and_every_projection_path(capsys):
    assert determinism_kernels.main(["--repeats", "1", "--prompt", "40"]) == 0
    out = capsys.readouterr().out
    assert "default (SDPA)" in out and "deterministic" in out
    assert "padded 128-row products" in out and ("AMX kernel" in out) == amx_supported()
    assert ("int4_fixed (deterministic)" in out) == int4_fixed_supported() and "torch int4" in out
    assert out.count("\n| ") == 2 + 4 + 6  # two headers, four and six row counts

"""``services.bench.attention``'s layer options: each runs on both CPU backends, and a bad one is refused by
name."""

from __future__ import annotations

import pytest
import torch

from services.bench.attention import Case, bench_case, layer_options


@pytest.mark.parametrize("spec", ["plain", "window=8", "sinks", "softcap=50"])
@pytest.mark.parametrize("backend", ["torch", "cpu_native"])
def test_every_layer_option_runs_on_both_backends(spec: str, backend: str) -> None:
    from kernels.attention.registry import BackendUnavailableError

    try:
        median, best, plan_ms = bench_case(Case("decode 2 x ctx 40", [1, 1], [40, 33]), torch.bfloat16, backend,
                                           "auto", layers=2, repeats=1, options=layer_options(spec))
    except BackendUnavailableError as exc:
        pytest.skip(f"{backend} unavailable: {exc}")
    assert 0 < best <= median and plan_ms > 0


def test_an_unknown_option_is_refused_by_name() -> None:
    assert layer_options("window=512") == {"window": 512} and layer_options("plain") == {}
    with pytest.raises(ValueError, match="unknown layer option 'alibi'"):
        layer_options("alibi")

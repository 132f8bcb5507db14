"""The recurrent layers' kernels (``kernels/gated_delta.py``, ``kernels/kimi_delta.py``, ``kernels/ssd.py``,
``kernels/selective_scan.py``) against transformers' reference functions, sequence by sequence: a batch of one-token and
longer sequences (past a chunk), some from a state, some fresh, their slots consecutive (updated through a view) or
scattered (gathered and written back); the outputs and the final states agree, and slots no sequence uses are
untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.gated_delta import Save, causal_conv1d, gated_delta_rule
from kernels.kimi_delta import kimi_delta_rule
from kernels.selective_scan import selective_scan
from kernels.ssd import ssd_scan

LENS = [1, 100, 1, 130, 7, 1]
FRESH = [False, True, True, False, False, False]
LAYOUTS = {"consecutive": [0, 1, 2, 3, 4, 5], "scattered": [6, 2, 9, 0, 4, 7]}


def _spans():
    start = 0
    for n in LENS:
        yield slice(start, start + n)
        start += n


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gated_delta_rule_matches_transformers(layout):
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    torch.manual_seed(0)
    slots, total, heads_k, heads_v, dk, dv = LAYOUTS[layout], sum(LENS), 2, 4, 16, 24
    q, k = torch.randn(total, heads_k, dk), torch.randn(total, heads_k, dk)
    v, g, beta = torch.randn(total, heads_v, dv), -torch.rand(total, heads_v), torch.rand(total, heads_v)
    before = torch.randn(10, heads_v, dk, dv) * 0.1
    states = before.clone()
    out = gated_delta_rule(q, k, v, g, beta, states, slots, LENS, FRESH)
    for b, span in enumerate(_spans()):
        initial = None if FRESH[b] else before[slots[b]][None].clone()
        expected, final = torch_recurrent_gated_delta_rule(
            q[None, span], k[None, span], v[None, span], g[None, span], beta[None, span], initial_state=initial,
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[span], expected[0], atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(states[slots[b]], final[0], atol=2e-6, rtol=1e-5)
    unused = [s for s in range(10) if s not in slots]
    assert torch.equal(states[unused], before[unused])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_kimi_delta_rule_matches_transformers(layout):
    """Against both of transformers' forms (its recurrence for one-token sequences, its chunks of 64 for longer),
    with decays strong enough that a key dim's decay differing from its neighbours' shows."""
    from transformers.models.kimi_linear.modeling_kimi_linear import (
        chunk_kimi_delta_attention,
        recurrent_kimi_delta_attention,
    )

    torch.manual_seed(1)
    slots, total, heads, dk, dv = LAYOUTS[layout], sum(LENS), 4, 16, 16
    q, k, v = torch.randn(total, heads, dk), torch.randn(total, heads, dk), torch.randn(total, heads, dv)
    g, beta = -torch.rand(total, heads, dk) * 2, torch.rand(total, heads)
    before = torch.randn(10, heads, dk, dv) * 0.1
    states = before.clone()
    out = kimi_delta_rule(q, k, v, g, beta, states, slots, LENS, FRESH)
    for b, span in enumerate(_spans()):
        initial = None if FRESH[b] else before[slots[b]][None].clone()
        reference = recurrent_kimi_delta_attention if LENS[b] == 1 else chunk_kimi_delta_attention
        expected, final = reference(q[None, span], k[None, span], v[None, span], g[None, span], beta[None, span],
                                    initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[span], expected[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(states[slots[b]], final[0], atol=2e-5, rtol=1e-5)
    unused = [s for s in range(10) if s not in slots]
    assert torch.equal(states[unused], before[unused])
    flat = kimi_delta_rule(q, k, v, g.mean(-1, keepdim=True).expand_as(g), beta, before.clone(), slots, LENS, FRESH)
    assert not torch.allclose(flat, out, atol=1e-3)  # the decay per key dim is what it computes


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_causal_conv1d_keeps_the_last_inputs(layout):
    torch.manual_seed(1)
    slots, channels, kernel = LAYOUTS[layout], 12, 4
    x, weight, bias = torch.randn(sum(LENS), channels), torch.randn(channels, kernel), torch.randn(channels)
    before = torch.randn(10, channels, kernel - 1)
    states = before.clone()
    out = causal_conv1d(x, weight, states, slots, LENS, FRESH, bias)
    for b, span in enumerate(_spans()):
        past = torch.zeros(channels, kernel - 1) if FRESH[b] else before[slots[b]]
        window = torch.cat([past, x[span].t()], dim=-1)
        expected = F.silu(F.conv1d(window[None], weight[:, None], bias, groups=channels)[0]).t()
        torch.testing.assert_close(out[span], expected)
        assert torch.equal(states[slots[b]], window[:, -(kernel - 1):])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_ssd_scan_matches_transformers(layout):
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import mamba2_chunk_scan

    torch.manual_seed(2)
    slots, total, heads, dim, groups, size = LAYOUTS[layout], sum(LENS), 4, 8, 2, 16
    x, raw_dt, a = torch.randn(total, heads, dim), torch.randn(total, heads), -torch.rand(heads) * 2
    dt_bias, b, c = torch.randn(heads) * 0.1, torch.randn(total, groups, size), torch.randn(total, groups, size)
    before = torch.randn(10, heads, size, dim) * 0.1
    states = before.clone()
    out = ssd_scan(x, F.softplus(raw_dt + dt_bias), a, b, c, states, slots, LENS, FRESH)
    for i, span in enumerate(_spans()):  # transformers' state is [heads, dim, size]
        initial = None if FRESH[i] else before[slots[i]].transpose(-1, -2)[None].contiguous()
        expected, final = mamba2_chunk_scan(x[None, span], raw_dt[None, span], a, b[None, span], c[None, span],
                                            chunk_size=32, dt_bias=dt_bias, initial_states=initial, dt_softplus=True,
                                            return_final_states=True)
        torch.testing.assert_close(out[span], expected[0], atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(states[slots[i]], final[0].transpose(-1, -2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_selective_scan_matches_transformers(layout):
    """Mamba-1's scan against Jamba's recurrent update, token by token from each sequence's state."""
    from transformers.models.jamba.modeling_jamba import mamba_selective_state_update

    torch.manual_seed(6)
    slots, total, channels, size = LAYOUTS[layout], sum(LENS), 12, 16
    x, raw_dt, a = torch.randn(total, channels), torch.randn(total, channels), -torch.rand(channels, size) * 2
    dt_bias, b, c = torch.randn(channels) * 0.1, torch.randn(total, size), torch.randn(total, size)
    before = torch.randn(10, channels, size) * 0.1
    states = before.clone()
    out = selective_scan(x, F.softplus(raw_dt + dt_bias), a, b, c, states, slots, LENS, FRESH)
    for i, span in enumerate(_spans()):
        state = torch.zeros(1, channels, size) if FRESH[i] else before[slots[i]][None].clone()
        expected = torch.cat([mamba_selective_state_update(state, x[t][None], raw_dt[t][None], a, b[t][None],
                                                           c[t][None], dt_bias=dt_bias, dt_softplus=True)
                              for t in range(span.start, span.stop)])
        torch.testing.assert_close(out[span], expected, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(states[slots[i]], state[0], atol=1e-5, rtol=1e-5)


# (sequence, rows, checkpoint row): mid-sequence, at a chunk's end, past it, at a sequence's end, a one-token sequence
SAVES = [Save(1, 37, 10), Save(1, 100, 11), Save(0, 1, 12), Save(3, 64, 13), Save(3, 65, 14), Save(5, 1, 15)]


def _delta_rule(rows: int):
    torch.manual_seed(3)
    q, k = torch.randn(rows, 2, 16), torch.randn(rows, 2, 16)
    v, g, beta = torch.randn(rows, 4, 24), -torch.rand(rows, 4), torch.rand(rows, 4)
    return (lambda span, states, slots, lens, fresh, saves=():
            gated_delta_rule(q[span], k[span], v[span], g[span], beta[span], states, slots, lens, fresh, saves)), \
        torch.randn(16, 4, 16, 24) * 0.1


def _kimi_delta(rows: int):
    torch.manual_seed(6)
    q, k, v = torch.randn(rows, 4, 16), torch.randn(rows, 4, 16), torch.randn(rows, 4, 16)
    g, beta = -torch.rand(rows, 4, 16), torch.rand(rows, 4)
    return (lambda span, states, slots, lens, fresh, saves=():
            kimi_delta_rule(q[span], k[span], v[span], g[span], beta[span], states, slots, lens, fresh, saves)), \
        torch.randn(16, 4, 16, 16) * 0.1


def _conv(rows: int):
    torch.manual_seed(4)
    x, weight, bias = torch.randn(rows, 12), torch.randn(12, 4), torch.randn(12)
    return (lambda span, states, slots, lens, fresh, saves=():
            causal_conv1d(x[span], weight, states, slots, lens, fresh, bias, saves)), torch.randn(16, 12, 3)


def _ssd(rows: int):
    torch.manual_seed(5)
    x, dt, a = torch.randn(rows, 4, 8), F.softplus(torch.randn(rows, 4)), -torch.rand(4) * 2
    b, c = torch.randn(rows, 2, 16), torch.randn(rows, 2, 16)
    return (lambda span, states, slots, lens, fresh, saves=():
            ssd_scan(x[span], dt[span], a, b[span], c[span], states, slots, lens, fresh, saves)), \
        torch.randn(16, 4, 16, 8) * 0.1


def _selective(rows: int):
    torch.manual_seed(7)
    x, dt, a = torch.randn(rows, 12), F.softplus(torch.randn(rows, 12)), -torch.rand(12, 16) * 2
    b, c = torch.randn(rows, 16), torch.randn(rows, 16)
    return (lambda span, states, slots, lens, fresh, saves=():
            selective_scan(x[span], dt[span], a, b[span], c[span], states, slots, lens, fresh, saves)), \
        torch.randn(16, 12, 16) * 0.1


@pytest.mark.parametrize("kernel", [_delta_rule, _kimi_delta, _conv, _ssd, _selective],
                         ids=["gated_delta_rule", "kimi_delta_rule", "causal_conv1d", "ssd_scan", "selective_scan"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_saved_state_is_the_state_after_that_many_rows(kernel, layout):
    """A prefix-cache checkpoint written mid-step (``saves``) is the state the sequence's first ``rows`` rows alone
    leave; the step's outputs and final states are those of the step without saves; other rows are untouched."""
    run, before = kernel(sum(LENS))
    slots, everything = LAYOUTS[layout], slice(0, sum(LENS))
    plain, saved = before.clone(), before.clone()
    want = run(everything, plain, slots, LENS, FRESH)
    got = run(everything, saved, slots, LENS, FRESH, SAVES)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(saved[slots], plain[slots], atol=1e-5, rtol=1e-4)
    spans = list(_spans())
    for save in SAVES:
        alone = before.clone()
        span = slice(spans[save.seq].start, spans[save.seq].start + save.rows)
        run(span, alone, [slots[save.seq]], [save.rows], [FRESH[save.seq]])
        torch.testing.assert_close(saved[save.into], alone[slots[save.seq]], atol=1e-5, rtol=1e-4)
    untouched = [s for s in range(16) if s not in slots and s not in {save.into for save in SAVES}]
    assert torch.equal(saved[untouched], before[untouched])
